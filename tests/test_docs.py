"""The docs stay true: the site builds with --strict (broken links, missing pages), the
argument tables are made from the code and an undocumented argument fails them, the snippets
a page marks runnable run (a DAG is imported by a DagBag, a shell line with `--help` runs),
and the README stays a front door (short, no tracker numbers, no file that is not here)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").rglob("*.md"))
TEXTS = [REPO / "README.md", REPO / "CHANGELOG.md", *PAGES]
BIN = Path(sys.executable).parent
# `<!-- runnable: dag -->` or `<!-- runnable: shell -->`, then the fenced block it marks
RUNNABLE = re.compile(r"<!-- runnable: (dag|shell) -->\n```\w*\n(.*?)\n```", re.S)


def _tables():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "scripts/docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snippets(kind: str) -> list[tuple[str, str]]:
    return [(path.relative_to(REPO).as_posix(), m.group(2)) for path in TEXTS
            for m in RUNNABLE.finditer(path.read_text()) if m.group(1) == kind]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True,
                          # the run's Airflow home (tests/airflow_env.py): the tables import
                          # the operators
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    tp = (tmp_path / "site/operators/tp-train.html").read_text()
    # the generated table reached the page: an argument of the base class, and the job spec's
    assert "heartbeat_timeout" in tp and "on_existing" in tp and "gradient_accumulation" in tp
    # the data/evaluation fields reached the job spec table and TPEvaluateOperator's page
    assert all(f"<code>{f}</code>" in tp for f in (
        "tokenizer", "validation_fraction", "eval_data", "eval_every", "ship_data"))
    ev = (tmp_path / "site/operators/tp-evaluate.html").read_text()
    assert "<code>fail_if</code>" in ev and "<code>max_new_tokens</code>" in ev
    assert (tmp_path / "site/benchmarks/allreduce-n2.png").stat().st_size > 0


@pytest.mark.parametrize("name", ["tp_train", "poprun", "tp_evaluate"])
def test_every_init_argument_has_a_row_saying_whether_it_is_templated(name):
    tables = _tables()
    cls = tables._operator(name)
    # | `name` | `type` | default | yes/no | rule |: a type's `|` is inside its code span
    rows = dict(re.match(r"\| `(\w+)` \|.*?\| (yes|no) \|", line).groups()
                for line in tables.operator_table(name).splitlines()[2:])
    arguments = {p.name for klass in cls.__mro__ if "__init__" in vars(klass)
                 and klass.__module__.startswith("ringflow_provider")
                 for p in inspect.signature(klass.__init__).parameters.values()} - {
        "self", "kwargs"}
    assert set(rows) == arguments
    assert {a for a, templated in rows.items() if templated == "yes"} == (
        arguments & set(cls.template_fields))
    if name == "tp_evaluate":
        assert rows["timeout"] == "no" and rows["fail_if"] == rows["checkpoint"] == "yes"
    else:
        assert rows["allow_unsafe_env"] == "no" and rows["hosts"] == "yes"


def test_an_argument_without_a_param_line_fails_the_table():
    tables = _tables()
    from ringflow_provider.operators.tp_train import TPTrainOperator

    class Undocumented(TPTrainOperator):
        """A subclass that adds an argument and says nothing about it."""

        def __init__(self, *, new_knob: int = 1, **kwargs):
            super().__init__(**kwargs)

    tables._operator = lambda name: Undocumented
    with pytest.raises(tables.MissingDocs, match="new_knob"):
        tables.operator_table("tp_train")


def test_the_job_spec_table_has_every_field_with_its_default():
    from ringflow.train.spec import JobSpec

    table = _tables().job_spec_table()
    for f in dataclasses.fields(JobSpec):
        assert f"| `{f.name}` |" in table
    assert "| `steps` | `int` | `200` |" in table


def test_the_operator_pages_carry_the_tables():
    assert "<!-- arguments: tp_train -->" in (REPO / "docs/operators/tp-train.md").read_text()
    assert "<!-- arguments: job_spec -->" in (REPO / "docs/operators/tp-train.md").read_text()
    assert "<!-- arguments: poprun -->" in (REPO / "docs/operators/poprun.md").read_text()
    assert "<!-- arguments: tp_evaluate -->" in (
        REPO / "docs/operators/tp-evaluate.md").read_text()


def test_the_dag_snippets_import_with_a_dagbag(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    found = snippets("dag")
    assert {where for where, _ in found} >= {"README.md", "docs/getting-started.md"}
    for i, (where, code) in enumerate(found):
        (tmp_path / f"snippet_{i}.py").write_text(f"# {where}\n{code}\n")
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {}
    assert {"my_first_training", "train_transformer"} <= set(bag.dags)
    assert [t.task_type for t in bag.dags["train_transformer"].tasks] == ["TPTrainOperator"]


def test_the_shell_snippets_run():
    found = snippets("shell")
    assert found
    for where, block in found:
        for line in block.splitlines():
            argv = shlex.split(line.split("#", 1)[0])
            assert "--help" in argv, f"{where}: a runnable shell line must be a --help: {line}"
            argv[0] = str(BIN / argv[0]) if (BIN / argv[0]).exists() else argv[0]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
            assert done.returncode == 0, f"{where}: {line}: {done.stderr[-500:]}"
            assert "usage:" in done.stdout.lower(), f"{where}: {line}"


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "docs/images/training-tab.png" in text and (REPO / "docs/images/training-tab.png"
                                                       ).exists()
    for command in ("make demo", "make test"):
        assert command in text
    assert "PaddlePaddle IPU launch controller" in text


# "issue 11", "issues 11 and 19", "#16": numbers of a tracker the reader cannot see
TRACKER = re.compile(r"\bissues? #?\d+|(?<![\w&])#\d+\b", re.I)


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_tracker_numbers_and_no_files_that_are_not_here(path):
    text = path.read_text()
    assert TRACKER.findall(text) == []
    # the team's folders and notes are not in the repository
    assert not re.search(r"DESIGN\.md|paddle-semantics|\.\./shared|/work/", text)
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                                 text=True).stdout.split())
    # paths the scripts make when they run (a results folder, the benchmarks' own venv)
    made = ("benchmarks/results/", "benchmarks/.venv-torch", "build/")
    named = re.findall(r"`((?:tests|benchmarks|scripts|dags|examples|provider|docs)/[\w./-]+)`",
                       text)
    named += [m for m in re.findall(r"\]\(([\w./-]+)\)", text) if path.name == "README.md"]
    missing = [p for p in named if not p.startswith(made)
               and not any(t == p.rstrip("/") or t.startswith(p.rstrip("/") + "/")
                           for t in tracked)]
    assert missing == []


def test_the_troubleshooting_page_holds_the_fault_table_markers():
    text = (REPO / "docs/troubleshooting.md").read_text()
    assert text.index("<!-- fault-table -->") < text.index("<!-- end fault-table -->")
