"""The outcome of one launcher agent: per-rank exit codes, the root cause, one JSON line.

The last line an agent prints is `[launch] result {json}`; `parse_result_line` reads it back
(the Airflow operator runs one agent per host and gathers these). No secret is in it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

RESULT_PREFIX = "[launch] result "


@dataclass(frozen=True)
class RankResult:
    rank: int
    local_rank: int
    pid: int
    returncode: int | None  # Popen style: -N for signal N; None if it never ended
    exit_code: int | None  # shell style: 128+N for signal N
    signal: str | None  # e.g. "SIGKILL" when a signal ended it
    # unix time it began to exit (a ringflow worker reports it before it closes its rings),
    # else when the launcher saw it exit: what orders failures across hosts
    ended_at: float | None
    after_peer_failure: bool  # it reported seeing a peer fail first (not the root cause)
    stopped_by_launcher: bool  # still running when the launcher began stopping the job
    # after_peer_failure: the global rank of the peer it saw fail (went silent, died, ...)
    blamed_rank: int | None = None


@dataclass(frozen=True)
class JobResult:
    job_id: str
    host: str
    host_index: int
    nproc_per_host: int
    world_size: int
    status: str  # "succeeded", "failed" (a rank failed) or "stopped" (launcher signalled)
    exit_code: int
    failed_rank: int | None
    cause: str
    duration_s: float
    log_dir: str
    ranks: list[RankResult] = field(default_factory=list)
    shm_removed: list[str] = field(default_factory=list)
    leftover_groups: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def line(self) -> str:
        return RESULT_PREFIX + self.to_json()


def parse_result_line(line: str) -> dict[str, Any] | None:
    """The result dict from an agent's output line, or None if the line is not one."""
    text = line.strip()
    if not text.startswith(RESULT_PREFIX.strip()):
        return None
    try:
        value = json.loads(text[len(RESULT_PREFIX.strip()):])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
