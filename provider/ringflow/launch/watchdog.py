"""The job watchdog: a small process that outlives a SIGKILLed launcher just long enough to
kill every worker's process group (grandchildren included) and sweep the job's shm segments.

The launcher holds the write end of the watchdog's stdin and sends `pg <pgid>` per worker;
`done` means the launcher cleaned up itself. EOF without `done` means the launcher died
(even by SIGKILL, since the kernel closes its pipe), and the watchdog tears the job down.
PR_SET_PDEATHSIG kills the workers themselves; only this reaches their children, which
setsid cut off from the launcher.

Run as `python -m ringflow.launch.watchdog <job id> <grace seconds>`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from typing import BinaryIO

from ringflow.errors import LaunchError
from ringflow.launch.processes import live_groups, signal_group, terminate_group
from ringflow.launch.shm import sweep_job_segments

KILL_WAIT_S = 5.0  # after SIGKILL a group empties at once unless a member is in the kernel


class WatchdogClient:
    """The launcher's end: start the watchdog, tell it each worker group, release it."""

    def __init__(self, job_id: str, grace_s: float) -> None:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ringflow.launch.watchdog", job_id, str(grace_s)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C must not reach it
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the job watchdog: {exc}") from exc

    def watch_group(self, pgid: int) -> None:
        self._send(f"pg {pgid}\n")

    def release(self, timeout_s: float = 5.0) -> None:
        """The launcher has cleaned up: the watchdog exits without touching anything."""
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


def read_until_done(stream: BinaryIO) -> tuple[list[int], bool]:
    """Collect group ids until `done` (True) or EOF (False: the launcher died)."""
    groups: list[int] = []
    for raw in stream:
        words = raw.split()
        if words == [b"done"]:
            return groups, True
        if len(words) == 2 and words[0] == b"pg" and words[1].isdigit():
            groups.append(int(words[1]))
    return groups, False


def stop_groups(groups: list[int], grace_s: float) -> set[int]:
    """SIGTERM every group, SIGKILL what is left after the grace; returns survivors."""
    for g in groups:
        terminate_group(g)
    deadline = time.monotonic() + grace_s
    while live_groups(groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for g in live_groups(groups):
        signal_group(g, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while (alive := live_groups(groups)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ringflow.launch.watchdog JOB_ID GRACE_S", file=sys.stderr)
        return 2
    job_id, grace_s = argv[0], float(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups, released = read_until_done(sys.stdin.buffer)
    if released:
        return 0
    survivors = stop_groups(groups, grace_s)
    removed = sweep_job_segments(job_id)
    with contextlib.suppress(OSError):  # nobody may be reading our stderr any more
        print(f"[launch] watchdog of job {job_id}: the launcher died; "
              f"stopped {len(groups)} worker groups, removed {len(removed)} shm segments"
              + (f", groups still alive: {sorted(survivors)}" if survivors else ""),
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
