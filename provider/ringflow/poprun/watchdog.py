"""`python -m ringflow.poprun.watchdog GRACE_S`: reads the job token as its first stdin line,
then waits; `done` releases it, the end of stdin without `done` (the ringflow-poprun that
started it is gone, even by SIGKILL) makes it stop this host's processes of the job.
"""

from __future__ import annotations

import contextlib
import signal
import sys

from ringflow.poprun.leftovers import ancestors, job_processes, stop_processes


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ringflow.poprun.watchdog GRACE_S (token on stdin)",
              file=sys.stderr)
        return 2
    grace_s = float(argv[0])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    spared = ancestors()  # now, while ringflow-poprun (and whoever started it) is above us
    token = sys.stdin.buffer.readline().strip().decode()
    released = any(line.strip() == b"done" for line in sys.stdin.buffer)
    if released or not token:
        return 0
    # never the processes that were above this one (a shell that exported the token, say)
    pids = job_processes(token, exclude=spared)
    survivors = stop_processes(pids, grace_s)
    with contextlib.suppress(OSError):  # nobody may be reading our stderr any more
        print(f"ringflow-poprun watchdog: ringflow-poprun died; stopped {len(pids)} process(es)"
              f" of its job" + (f", still alive: {survivors}" if survivors else ""),
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
