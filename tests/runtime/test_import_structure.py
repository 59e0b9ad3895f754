"""No circles among the runtime's modules (issue 19): the import graph of ``ringflow``,
every ``import`` counted wherever it stands (a function-level import is still a
dependency; ``if TYPE_CHECKING:`` ones are not), has no cycle through the modules below;
``stable_seed`` lives below the initializers and layers, which do not import the
executor."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import ringflow

ROOT = Path(ringflow.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the ringflow modules it imports (``from pkg import mod`` as mod; a package
    ``__init__`` that only re-exports lazily counts as itself)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and getattr(node.test, "id", "") == "TYPE_CHECKING"
                       for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{name}.{alias.name}"
                    target = sub if sub in mods else name
                    if target in mods and target != mod:
                        graph[mod].add(target)
            elif isinstance(node, ast.Import):
                graph[mod].update(a.name for a in node.names if a.name in mods)
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return False


MODULES = ["ringflow.compiler.plan", "ringflow.compiler.steps", "ringflow.compiler.buckets",
           "ringflow.compiler.fuse_gemm", "ringflow.compiler.fuse_optimizer",
           "ringflow.compiler.param_gather", "ringflow.compiler.grad_shards",
           "ringflow.backward", "ringflow.recompute", "ringflow.autodiff",
           "ringflow.framework.records", "ringflow.framework.program",
           "ringflow.framework.printer", "ringflow.seeds", "ringflow.initializer"]


@pytest.mark.parametrize("module", MODULES)
def test_the_module_is_on_no_import_cycle(module):
    graph = import_graph()
    back = [m for m in graph[module] if reaches(graph, m, module)]
    assert back == [], f"{module} imports {back}, which import it back"


def test_initializers_and_layers_take_stable_seed_from_below_the_executor():
    graph = import_graph()
    for module in ("ringflow.initializer", "ringflow.nn"):
        assert "ringflow.seeds" in graph[module]
        assert not reaches(graph, module, "ringflow.executor"), module
