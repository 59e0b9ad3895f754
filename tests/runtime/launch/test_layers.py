"""`ringflow.launch` is the bottom layer of launching: `ringflow.poprun` builds on it, so
nothing in `ringflow.launch` imports `ringflow.poprun`, neither in its modules nor in the
code it runs with `python -c` on other hosts."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[3] / "provider" / "ringflow" / "launch"


def imported_modules(source: str) -> set[str]:
    """Every module an `import` or `from ... import` names, also inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "import " in node.value):  # code run with `python -c`
            with contextlib.suppress(SyntaxError):  # prose that mentions an import
                names |= imported_modules(node.value)
    return names


def test_no_launch_module_imports_poprun():
    modules = sorted(LAUNCH.glob("*.py"))
    assert len(modules) > 10
    offenders = {path.name: sorted(m for m in imported_modules(path.read_text())
                                   if m == "ringflow.poprun" or m.startswith("ringflow.poprun."))
                 for path in modules}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_import_check_sees_imports_in_functions_and_in_python_c_code():
    source = ('def f():\n    import ringflow.poprun.args\n'
              'CODE = "import sys\\nfrom ringflow.poprun import main\\n"\n')
    assert imported_modules(source) == {"ringflow.poprun.args", "sys", "ringflow.poprun"}


def test_running_the_mpirun_launcher_and_the_agent_loads_no_poprun_module():
    code = ("import sys\nimport ringflow.launch.mpirun, ringflow.launch.cli, "
            "ringflow.launch.watchdog\n"
            "print(sorted(m for m in sys.modules if m.startswith('ringflow.poprun')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(LAUNCH.parents[1])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
