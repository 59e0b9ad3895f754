"""The docs' argument tables, made from the code (an MkDocs hook, also imported by the tests).

A page says `<!-- arguments: tp_train -->` (or `poprun`, `tp_evaluate`, `job_spec`) on a line
of its own and the build puts the table there: every `__init__` argument of the operator (its
own and `RingflowJobOperator`'s) with its type and default from the signature, "templated" from
the class's `template_fields`, and the rule from the `:param name:` line of the docstrings; the
job spec's fields from `JobSpec`'s dataclass fields and `FIELD_DOCS`. An argument without a
`:param:` line has no row to write and fails the build.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- arguments: (\w+) -->$", re.M)
INCLUDE = re.compile(r"^<!-- include: ([\w.-]+) -->$", re.M)
_PARAM = re.compile(r"^\s*:param (\w+):(.*(?:\n(?!\s*:param |\s*$)\s+.*)*)", re.M)


class MissingDocs(Exception):
    """An argument the code takes that no docstring describes."""


# a page's `<!-- arguments: NAME -->` -> the operator whose table it gets
OPERATORS = {"tp_train": "ringflow_provider.operators.tp_train:TPTrainOperator",
             "poprun": "ringflow_provider.operators.poprun:PopRunOperator",
             "tp_evaluate": "ringflow_provider.operators.tp_evaluate:TPEvaluateOperator"}


def _operator(name: str) -> type:
    module, _, cls = OPERATORS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def param_docs(cls: type) -> dict[str, str]:
    """`:param name: text` of the class and its bases' docstrings (the class's own first)."""
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        for name, text in _PARAM.findall(inspect.getdoc(klass) or ""):
            docs.setdefault(name, " ".join(text.split()))
    return docs


def init_arguments(cls: type) -> list[inspect.Parameter]:
    """The keyword arguments of the operator's `__init__` and of its bases' up to Airflow's
    (`BaseOperator`'s own arguments are Airflow's to document)."""
    seen: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if klass.__module__.startswith(("airflow", "builtins")) or "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.name != "self" and p.kind is not p.VAR_KEYWORD:
                seen.setdefault(p.name, p)
    return list(seen.values())


def _type(annotation: Any) -> str:
    # inside a code span a table's `|` is text (an escaped one would show its backslash)
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _default(p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return "required"
    text = repr(p.default)
    if text.startswith("<"):  # a sentinel: the docstring says what it stands for
        text = "see the rule"
    return f"`{text}`"


def _cell(text: str) -> str:
    """A docstring's text as a table cell: reST ``code`` as Markdown `code`, and a `|` outside
    code escaped (inside code the table leaves it alone)."""
    parts = re.split(r"(``[^`]+``)", text)
    return "".join(f"`{p[2:-2]}`" if p.startswith("``") else p.replace("|", "\\|")
                   for p in parts)


def operator_table(name: str) -> str:
    cls = _operator(name)
    docs, templated = param_docs(cls), set(cls.template_fields)
    missing = [p.name for p in init_arguments(cls) if p.name not in docs]
    if missing:
        raise MissingDocs(f"{cls.__name__}: no :param: line for {', '.join(missing)}")
    rows = ["| argument | type | default | templated | rule |", "|---|---|---|---|---|"]
    for p in init_arguments(cls):
        rows.append(f"| `{p.name}` | `{_type(p.annotation)}` | {_default(p)} | "
                    f"{'yes' if p.name in templated else 'no'} | {_cell(docs[p.name])} |")
    return "\n".join(rows)


def job_spec_table() -> str:
    from ringflow.train.spec import FIELD_DOCS, JobSpec
    fields = dataclasses.fields(JobSpec)
    missing = [f.name for f in fields if f.name not in FIELD_DOCS]
    if missing:
        raise MissingDocs(f"JobSpec: no FIELD_DOCS entry for {', '.join(missing)}")
    rows = ["| field | type | default | what |", "|---|---|---|---|"]
    for f in fields:
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{f.default_factory()!r}`"
        else:
            default = "required"
        rows.append(f"| `{f.name}` | `{_type(f.type)}` | {default} | "
                    f"{_cell(FIELD_DOCS[f.name])} |")
    return "\n".join(rows)


def _table(name: str) -> str:
    return job_spec_table() if name == "job_spec" else operator_table(name)


def _included(name: str) -> str:
    """A file of the repository's top (the changelog) without its title."""
    text = (ROOT / name).read_text()
    return text.split("\n", 1)[1] if text.startswith("# ") else text


def fill(markdown: str) -> str:
    """The page with each `<!-- arguments: NAME -->` followed by its table and each
    `<!-- include: FILE -->` replaced by that file of the repository's top."""
    markdown = INCLUDE.sub(lambda m: _included(m.group(1)), markdown)
    return MARKER.sub(lambda m: f"{m.group(0)}\n\n{_table(m.group(1))}\n", markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:  # the MkDocs hook
    return fill(markdown)


def on_files(files: Any, config: Any) -> Any:  # the MkDocs hook
    """The benchmarks' plots, which their scripts write next to their JSONL files in
    benchmarks/ (`allreduce.py --report FILE`, `scaling.py report`), served as
    benchmarks/NAME.png: the site shows what the scripts drew, never a copy."""
    from mkdocs.structure.files import File
    for png in sorted((ROOT / "benchmarks").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/{png.name}", abs_src_path=str(png)))
    return files
