"""How a PopRun job ended, as the task reports it, without Airflow: success, skipped (an
exit code the task skips on), or a failure naming the host, the exit (a signal by name, a
vanished supervisor) and the last lines of the job's output."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from ringflow.launch.exits import describe_exit


def exit_problem(exit_code: int, tail: list[str], host: str, final: dict[str, Any],
                 skip_on: Container[int]) -> tuple[str, str] | None:
    """None when the job succeeded; else ("skip" | "fail", message)."""
    if exit_code == 0 and final.get("state") == "ended":
        return None
    if exit_code in skip_on:
        return "skip", f"PopRun exited with {exit_code} on {host!r}: skipped"
    if final.get("state") == "lost":
        how = ("without an exit status (its supervisor vanished: the host rebooted, or it "
               "was killed)")
    else:
        how = f"with {describe_exit(exit_code)}"
    lines = "\n".join(tail)
    return "fail", f"PopRun failed on {host!r} {how}; last {len(tail)} lines:\n{lines}"
