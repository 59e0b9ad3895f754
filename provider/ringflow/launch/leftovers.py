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
from ringflow.launch.processes import scan_processes, stopped_processes

__all__ = ["DAEMON_LOST_TAG", "FROZEN_WORDS", "GIVEN_UP_WORDS", "alive", "ancestors",
           "daemon_lost_host", "frozen_given_up_host",
           "frozen_relatives", "job_processes", "processes_with_env", "stop_frozen_job_command",
           "stop_processes", "stop_task_command", "stopped_processes"]

PROC = Path("/proc")
KILL_WAIT_S = 5.0
# what a stop says of a job whose processes it found halted (the launcher names the host
# frozen when it reads these words in what the stop said)
FROZEN_WORDS = "frozen (stopped by SIGSTOP)"
# how an mpirun job says what the stop did on a host it gave up as silent:
# ``<host> (given up): <what the stop there printed>``
GIVEN_UP_WORDS = "(given up)"
# ... and a host whose Open MPI daemon mpirun lost (the host rebooted, its daemon was killed,
# the network dropped it): ``<host> (daemon lost): <what mpirun said>``
DAEMON_LOST_TAG = "(daemon lost)"


def frozen_given_up_host(line: str) -> str | None:
    """The host of a launcher's own line saying that the stop on a host given up found the
    job frozen (``... <host> (given up): ...; N of them were frozen ...``)."""
    return _host_of_launcher_line(line, GIVEN_UP_WORDS, FROZEN_WORDS)


def daemon_lost_host(line: str) -> str | None:
    """The host of a launcher's own line saying that mpirun lost its Open MPI daemon there
    (``... <host> (daemon lost): ...``)."""
    return _host_of_launcher_line(line, DAEMON_LOST_TAG, DAEMON_LOST_TAG)


def _host_of_launcher_line(line: str, tag: str, words: str) -> str | None:
    """The host named before `tag` in a launcher's own line (``[launch] ...``: a rank's
    lines are tagged ``[rank N]``, so a rank cannot forge one) that holds `words`. Linear in
    the line's length (every line of a job's output is read here): no regular expression
    that backtracks."""
    if not line.startswith("[launch] ") or words not in line:
        return None
    head, found, _ = line.partition(f" {tag}: ")
    names = head.split()
    if not found or len(names) < 2 or names[-1].startswith("[") or names[-1].endswith(":"):
        return None
    return names[-1]


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


def frozen_relatives(pids: list[int]) -> tuple[list[int], list[int]]:
    """On a host whose job was frozen (SIGSTOP), the processes of the job's `pids` family
    that carry no job marker: (the stopped ancestors of `pids`: Open MPI's daemon, which gets
    no variable it exports to the processes it starts, and would keep its SIGHUP pending for
    ever; the stopped descendants that are not in `pids`: a job watchdog, which has work to
    do once continued, when its owner ends)."""
    rows = {p: (state, ppid) for p, state, ppid, _ in scan_processes()}
    stopped = {p for p, (state, _) in rows.items() if state in ("T", "t")}
    above: list[int] = []
    for pid in pids:
        current = rows.get(pid, ("X", 0))[1]
        while current > 1 and current in stopped and current not in above:
            above.append(current)
            current = rows[current][1]
    family, below, grown = set(pids), [], True
    while grown:
        grown = False
        for pid, (_, ppid) in rows.items():
            if ppid in family and pid not in family:
                family.add(pid)
                grown = True
                if pid in stopped:
                    below.append(pid)
    return [p for p in above if p not in pids], below


_STOP_FROZEN = """import os, signal, sys
from ringflow.launch import leftovers as lo
pids = lo.job_processes(sys.stdin.readline().strip(), exclude=lo.ancestors())
above, below = lo.frozen_relatives(pids)
frozen = lo.stopped_processes(pids + above + below)
for pid in below:
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass
pids += above
left = lo.stop_processes(pids, float(sys.argv[1])) if pids else []
print("stopped %d process(es) of the job%s%s" % (
    len(pids), "; %d of them were %s" % (len(frozen), lo.FROZEN_WORDS) if frozen else "",
    " (still alive: %s)" % left if left else "") if pids else "nothing of the job left")
"""


def stop_frozen_job_command(python: str, grace_s: float) -> list[str]:
    """argv that stops, on a host, every process of this user that carries the job token
    read from its stdin (never on a command line: `ps` shows those), with the stopped
    (frozen) processes above them: SIGTERM and SIGCONT, SIGKILL after `grace_s`. What it
    prints says how many were frozen (FROZEN_WORDS)."""
    return [python, "-c", _STOP_FROZEN, str(grace_s)]


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
