"""Finding and stopping this host's processes of a job by a marker in their environment
(the job token, a task's marker), whoever their parent is now; and the command that does it
on another host.

mpirun gives each process it starts on its own host a process group of its own and leaves
them running when it dies abruptly (SIGKILL; or SIGTERM while its output pipe is gone, which
kills mpirun by SIGPIPE before it stops anyone). Every process of a job, and everything it
starts, carries the job token in its environment (mpirun exports it): that, not a pid list
built while they start, finds them all, even one started a moment before a SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from ringflow.launch.env import JOB_TOKEN_VAR
from ringflow.launch.processes import scan_processes

__all__ = ["alive", "ancestors", "job_processes", "processes_with_env", "stop_processes",
           "stop_task_command"]

PROC = Path("/proc")
KILL_WAIT_S = 5.0


def ancestors(pid: int | None = None) -> set[int]:
    """`pid` (default: this process) and every process above it."""
    parents = {p: ppid for p, _, ppid, _ in scan_processes()}
    chain, current = set(), os.getpid() if pid is None else pid
    while current > 0 and current not in chain:
        chain.add(current)
        current = parents.get(current, 0)
    return chain


def job_processes(token: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes of this user whose environment holds the job's token."""
    return processes_with_env(JOB_TOKEN_VAR, token, exclude)


def processes_with_env(name: str, value: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes of this user whose environment has `name`=`value`."""
    needle = f"{name}={value}".encode() + b"\0"
    skip, uid, found = set(exclude), os.getuid(), []
    for pid, state, _, _ in scan_processes():
        if pid in skip or state in ("Z", "X"):
            continue
        entry = PROC / str(pid)
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = (entry / "environ").read_bytes() + b"\0"
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if b"\0" + needle in b"\0" + environ:
            found.append(pid)
    return found


def alive(pids: Iterable[int]) -> list[int]:
    """The processes among `pids` that live (not zombies)."""
    state = {pid: s for pid, s, _, _ in scan_processes()}
    return [pid for pid in pids if state.get(pid, "X") not in ("Z", "X")]


def stop_processes(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM (and SIGCONT) each, SIGKILL what is left after the grace; returns survivors."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
    for wait_s, then in ((grace_s, signal.SIGKILL), (KILL_WAIT_S, None)):
        deadline = time.monotonic() + wait_s
        while (left := alive(pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if then is None or not left:
            return left
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, then)
    return alive(pids)


_STOP_TASK = """import sys
from ringflow.launch.leftovers import ancestors, processes_with_env, stop_processes
pids = processes_with_env(sys.argv[1], sys.argv[2], exclude=ancestors())
left = stop_processes(pids, float(sys.argv[3])) if pids else []
print("stopped %d process(es) of an earlier try%s" % (len(pids), " (still alive: %s)" % left
      if left else "") if pids else "nothing of an earlier try left")
"""


def stop_task_command(python: str, name: str, value: str, grace_s: float = 5.0) -> list[str]:
    """argv that stops, on a host, every process of this user whose environment has
    `name`=`value` (a task's marker: what earlier tries of the task left)."""
    return [python, "-c", _STOP_TASK, name, value, str(grace_s)]
