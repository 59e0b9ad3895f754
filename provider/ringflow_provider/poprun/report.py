"""What a PopRun task reports: the plan it logs, the tail of the job's output it keeps, the
summary it returns (its XCom), and the job's end turned into the task's outcome (skipped or
failed, the failure naming the host, the exit and the last lines; `outcome.exit_problem`)."""

from __future__ import annotations

import shlex
import time
from collections import deque
from collections.abc import Callable, Container
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from ringflow_provider.exceptions import RingflowJobFailedException
from ringflow_provider.launchers.lines import JobLine
from ringflow_provider.poprun.compose import PopRunConfig
from ringflow_provider.poprun.outcome import exit_problem

__all__ = ["TAIL_LINES", "Tail", "check_exit", "duration_s", "plan_text", "summary"]

TAIL_LINES = 20


class Tail:
    """The last lines of a PopRun job's output (for a failure message)."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)

    def feed(self, line: JobLine) -> None:
        self.lines.append(line.text)


def plan_text(config: PopRunConfig, launch_host: str, masked: list[str]) -> tuple[str, str]:
    """The job's shape, then its command one token a line (as the seed prints it; still a
    valid shell command): the two lines the task logs before it starts anything."""
    hosts = len(config.hosts)
    shape = (f"PopRun job: {config.num_instances} instance(s) ({config.nproc_per_host} per "
             f"host on {hosts} host{'' if hosts == 1 else 's'}: {','.join(config.hosts)}), "
             f"{config.num_replicas} replica(s) of {config.ipus_per_replica} IPU(s), "
             f"partition {config.ipu_partition!r} on V-IPU server {config.vipu_server!r}")
    command = (f"PopRun command on {launch_host}:\n"
               + " \\\n    ".join(shlex.quote(token) for token in masked))
    return shape, command


def summary(config: PopRunConfig, masked: list[str], launch_host: str | None,
            dry_run: bool) -> dict[str, Any]:
    """The task's summary before the job ends (exit_code and duration_s set at its end)."""
    return {"argv": masked, "num_instances": config.num_instances,
            "num_replicas": config.num_replicas, "launch_host": launch_host,
            "exit_code": None, "duration_s": 0.0, "dry_run": dry_run}


def duration_s(started: float | None, final: dict[str, Any]) -> float:
    """Seconds the job ran: by this process's clock when it watched from the start, else
    (after a deferral) from the job's status."""
    if started:
        return round(time.monotonic() - started, 3)
    return round(max(0.0, (final.get("ended_at") or 0) - (final.get("started_at") or 0)), 3)


def check_exit(exit_code: int, tail: list[str], host: str, final: dict[str, Any],
               skip_on: Container[int], mask: Callable[[str], str]) -> None:
    """Nothing when the job succeeded; else the task is skipped or fails (messages masked)."""
    problem = exit_problem(exit_code, tail, host, final, skip_on)
    if problem is not None:
        kind, message = problem
        if kind == "skip":
            raise AirflowSkipException(mask(message))
        raise RingflowJobFailedException(mask(message), exit_code, host)
