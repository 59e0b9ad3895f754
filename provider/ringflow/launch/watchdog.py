"""The job watchdog: a small process that outlives its SIGKILLed owner (a launcher agent, an
mpirun job) just long enough to stop what the owner started and sweep the job's shm here.

The owner holds the write end of the watchdog's stdin and sends one order per line:
`pg <pgid>` (a worker's process group: its children too, which setsid cut off from the
owner and PR_SET_PDEATHSIG does not reach), `env <NAME>=<VALUE>` (a job marker: every
process of this user whose environment holds it is the job's, whoever its parent is now,
as with mpirun's children on this host), `spare <pid> ...` (the owner and the processes
above it: the watchdog may start only after the owner died, when its own parent chain no
longer leads there), `done` (the owner cleaned up: touch nothing).
EOF without `done` means the owner died (even by SIGKILL, since the kernel closes its
pipe): the watchdog stops the groups and the marked processes, never one that was above it,
and removes the job's shm segments. A marker's value may be the job token: it comes on
stdin, never on a command line, and the watchdog's own environment does not hold it.

Run as `python -m ringflow.launch.watchdog <job id> <grace seconds>`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from ringflow.errors import LaunchError
from ringflow.launch.env import JOB_TOKEN_VAR
from ringflow.launch.leftovers import alive, ancestors, processes_with_env
from ringflow.launch.processes import live_groups, signal_group, terminate_group
from ringflow.launch.shm import sweep_job_segments

KILL_WAIT_S = 5.0  # after SIGKILL a process ends at once unless it is inside the kernel
POLL_S = 0.05
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class WatchdogClient:
    """The owner's end: start the watchdog, tell it the job's groups and marker, release it.

    `marker` (NAME, VALUE), when given, marks the job's processes (the job token: secret,
    so it goes over the pipe). The watchdog's environment holds neither it nor the token:
    it must never find itself, or hold a secret it does not need.
    """

    def __init__(self, job_id: str, grace_s: float,
                 marker: tuple[str, str] | None = None) -> None:
        hidden = {JOB_TOKEN_VAR, *(marker[:1] if marker else ())}
        env = {k: v for k, v in os.environ.items() if k not in hidden}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ringflow.launch.watchdog", job_id, str(grace_s)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                start_new_session=True,  # a terminal's Ctrl-C must not reach it
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the job watchdog: {exc}") from exc
        if marker is not None:  # a shell above us that exported the marker is not the job
            self._send(f"spare {' '.join(map(str, sorted(ancestors())))}\n"
                       f"env {marker[0]}={marker[1]}\n")

    def watch_group(self, pgid: int) -> None:
        self._send(f"pg {pgid}\n")

    def release(self, timeout_s: float = 5.0) -> None:
        """The owner has cleaned up: the watchdog exits without touching anything."""
        with contextlib.suppress(LaunchError):  # gone already: nothing to release
            self._send("done\n")
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise LaunchError(f"the job watchdog (pid {self.proc.pid}) is gone: {exc}") from exc


@dataclass
class Orders:
    """What the owner told the watchdog before `done` (released) or EOF (it died)."""

    groups: list[int] = field(default_factory=list)
    markers: list[tuple[str, str]] = field(default_factory=list)
    released: bool = False
    spared: set[int] = field(default_factory=set)


def read_until_done(stream: BinaryIO) -> Orders:
    """Collect the orders until `done` or EOF; a line that is no order is ignored."""
    orders = Orders()
    for raw in stream:
        words = raw.split()
        if words == [b"done"]:
            orders.released = True
            return orders
        if len(words) == 2 and words[0] == b"pg" and words[1].isdigit():
            orders.groups.append(int(words[1]))
        elif words[:1] == [b"spare"] and all(word.isdigit() for word in words[1:]):
            orders.spared.update(int(word) for word in words[1:])
        elif raw.startswith(b"env "):
            name, eq, value = raw[4:].rstrip(b"\r\n").decode("utf-8", "replace").partition("=")
            if eq and _ENV_NAME.match(name):
                orders.markers.append((name, value))
    return orders


def marked_processes(markers: Iterable[tuple[str, str]], spared: set[int]) -> list[int]:
    """Live processes of this user carrying any of the markers, except `spared`."""
    found: dict[int, None] = {}
    for name, value in markers:
        found.update(dict.fromkeys(processes_with_env(name, value, exclude=spared)))
    return list(found)


def _wait(groups: list[int], pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (live_groups(groups) or alive(pids)) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _signal_pids(pids: Iterable[int], *signals: int) -> None:
    for sig in signals:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def stop_job(orders: Orders, grace_s: float, spared: set[int]) -> tuple[int, set[int], list[int]]:
    """SIGTERM (and SIGCONT) every group and marked process, SIGKILL what is left after the
    grace, and what was marked meanwhile; returns (marked processes found, groups and
    processes still alive)."""
    marked = marked_processes(orders.markers, spared)
    for pgid in orders.groups:
        terminate_group(pgid)
    _signal_pids(marked, signal.SIGTERM, signal.SIGCONT)
    _wait(orders.groups, marked, grace_s)
    for pgid in live_groups(orders.groups):
        signal_group(pgid, signal.SIGKILL)
    late = [p for p in marked_processes(orders.markers, spared) if p not in marked]
    marked += late
    _signal_pids(alive(marked), signal.SIGKILL)
    _wait(orders.groups, marked, KILL_WAIT_S)
    return len(marked), live_groups(orders.groups), alive(marked)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ringflow.launch.watchdog JOB_ID GRACE_S (orders on stdin)",
              file=sys.stderr)
        return 2
    job_id, grace_s = argv[0], float(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    spared = ancestors()  # now, while the owner (and whoever started it) may be above us
    orders = read_until_done(sys.stdin.buffer)
    if orders.released:
        return 0
    marked, groups_left, left = stop_job(orders, grace_s, spared | orders.spared)
    removed = sweep_job_segments(job_id)
    still = ([f"groups still alive: {sorted(groups_left)}"] if groups_left else []) + (
        [f"processes still alive: {left}"] if left else [])
    with contextlib.suppress(OSError):  # nobody may be reading our stderr any more
        print(f"[launch] watchdog of job {job_id}: its owner died; stopped "
              f"{len(orders.groups)} worker group(s) and {marked} process(es) carrying the "
              f"job's marker, removed {len(removed)} shm segment(s)"
              + "".join(f"; {s}" for s in still), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
