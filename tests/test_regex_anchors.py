"""Validation rules anchor at the true end of a value: in Python's `re`, `$` also matches
before a trailing newline, so `re.match(r"^name$", "node1\\n")` passes a value with a newline
in it (a host, a job id, an env name that then reaches a command line or a file name). Every
pattern in provider/ ends in `\\Z` (or is used with `fullmatch`); the few patterns shared
with JSON schema (ECMA has no `\\Z`) end in `\\s*$`, which takes trailing whitespace (a
newline too) on purpose and whose value is stripped."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.launch.config import _MODULE
from ringflow.launch.openmpi import EXIT_LINE, RANK_EXIT_LINE
from ringflow.launch.stdin import _ENV_NAME as STDIN_ENV_NAME
from ringflow.launch.watchdog import _ENV_NAME as WATCHDOG_ENV_NAME
from ringflow.naming import check_host, check_job_id
from ringflow.train.checkpoint import _STEP_RE
from ringflow.train.spec import _BUILDER_RE

PROVIDER = Path(__file__).resolve().parents[1] / "provider"
_RE_CALLS = {"compile", "match", "search", "fullmatch"}


def _tail(node: ast.expr) -> str | None:
    """The literal end of a pattern argument (a string, bytes, or an f-string's last part)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        value = node.value
        return value.decode("latin-1") if isinstance(value, bytes) else value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _tail(node.values[-1]) if isinstance(node.values[-1], ast.Constant) else None
    return None


def _dollar_patterns(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of every `re.<call>(pattern, ...)` whose literal pattern ends in `$`
    (not `\\s*$`), unless the call is fullmatch; and every module-level `*_PATTERN` string
    ending in a bare `$` that some `re.match`/`re.search` of the module reads."""
    found = []
    patterns = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            tail = _tail(node.value)
            if tail is not None:
                patterns[node.targets[0].id] = tail
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                and node.func.attr in _RE_CALLS and node.args):
            continue
        arg = node.args[0]
        tail = _tail(arg) if not isinstance(arg, ast.Name) else patterns.get(arg.id)
        if tail is None or node.func.attr == "fullmatch":
            continue
        if tail.endswith("$") and not tail.endswith((r"\$", r"\s*$")):
            found.append((node.lineno, f"re.{node.func.attr}"))
    return found


def test_no_pattern_in_the_provider_ends_in_a_dollar_that_lets_a_trailing_newline_pass():
    offenders = []
    for path in sorted(PROVIDER.rglob("*.py")):
        for line, call in _dollar_patterns(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(PROVIDER)}:{line} {call}")
    assert offenders == []


def test_the_scan_finds_a_dollar_pattern_and_passes_the_anchored_forms():
    bad = ast.parse('import re\nA = re.compile(r"^x$")\nP = r"^y$"\nre.match(P, "y")\n'
                    'B = re.compile(rf"^{A}$")\n')
    good = ast.parse('import re\nA = re.compile(r"^x\\Z")\nre.fullmatch(r"x$", "x")\n'
                     'S = r"^\\s*x\\s*$"\nre.search(S, "x")\nre.compile(r"a\\$")\n')
    assert [line for line, _ in _dollar_patterns(bad)] == [2, 4, 5]
    assert _dollar_patterns(good) == []


@pytest.mark.parametrize("check", [check_host, check_job_id])
def test_a_host_or_job_id_with_a_trailing_newline_is_refused(check):
    assert check("node1") == "node1"
    with pytest.raises(ConfigError):
        check("node1\n")


@pytest.mark.parametrize("rule, value", [
    (_MODULE, "pkg.mod"), (STDIN_ENV_NAME, "NAME"), (WATCHDOG_ENV_NAME, "NAME"),
    (_STEP_RE, "step-00000001"), (_BUILDER_RE, "pkg.mod:fn"),
    (EXIT_LINE, "ringflow-poprun-exit 0f1e 0 1.5"), (RANK_EXIT_LINE, "ringflow-exit-time 1.5"),
])
def test_every_rule_takes_its_value_but_not_the_value_with_a_trailing_newline(rule, value):
    assert rule.match(value) and not rule.match(value + "\n")

