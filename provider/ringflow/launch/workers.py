"""One rank's process as the launcher agent sees it (`Worker`), the wait for the ranks' exits
in the order they happen (`ExitWaiter`), and the signals the agent turns into stop requests
(`SignalTrap`).

Each worker is the leader of its own session and process group (pgid == pid). Its exit is
observed without reaping it (waitid WNOWAIT) until the very end, so its pid, and with it the
group id the agent signals, cannot be reused by a stranger while the job runs.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ringflow.launch.exits import host_time
from ringflow.launch.logs import LogPump
from ringflow.launch.processes import exit_status

__all__ = ["ExitWaiter", "SignalTrap", "Worker", "open_pidfd"]


@dataclass
class Worker:
    """One rank: its process (the leader of its own group), its log and what is known of
    its exit."""

    local_rank: int
    rank: int
    proc: subprocess.Popen
    log_path: Path
    pump: LogPump | None = None
    returncode: int | None = None
    ended_at: float | None = None  # unix time its exit was seen, to order failures
    stopped: bool = False
    pidfd: int | None = None  # readable once the process exits (Linux >= 5.3)

    @property
    def pgid(self) -> int:
        return self.proc.pid

    @property
    def began_exit_at(self) -> float | None:
        """When it began to exit: its own report (a ringflow worker's, before it closes its
        rings), else when its exit was seen."""
        reported = self.pump.began_exit_at if self.pump is not None else None
        known = [t for t in (reported, self.ended_at) if t is not None]
        return round(min(known), 6) if known else None

    @property
    def after_peer_failure(self) -> bool:
        """It reported that it saw a peer fail before it did (a consequence, not a cause)."""
        return self.pump is not None and self.pump.after_peer_failure

    @property
    def blamed_rank(self) -> int | None:
        """The global rank of the peer it saw fail, where it said."""
        return self.pump.blamed_rank if self.pump is not None else None

    def check_exit(self) -> bool:
        """Record the exit status once the process ended (without reaping it)."""
        if self.returncode is None:
            self.returncode = exit_status(self.proc.pid)
            if self.returncode is not None:
                self.ended_at = round(host_time(), 3)
        return self.returncode is not None


class ExitWaiter:
    """Sleeps until a worker exits or a timeout passes, so exits are seen in the order they
    happen (the first failure is the root cause), not in rank order once per poll."""

    def __init__(self, workers: list[Worker]) -> None:
        self._workers = workers
        self._poll = select.poll()
        self._by_fd = {w.pidfd: w for w in workers if w.pidfd is not None}
        for fd in self._by_fd:
            self._poll.register(fd, select.POLLIN)

    def ended(self, timeout_s: float) -> list[Worker]:
        """Workers whose exit was first seen in this call, earliest first."""
        if self._by_fd:
            events = self._poll.poll(timeout_s * 1000)
        else:
            time.sleep(timeout_s)
            events = []
        first = [self._by_fd[fd] for fd, _ in events if fd in self._by_fd]
        for fd, _ in events:
            self._poll.unregister(fd)
            self._by_fd.pop(fd, None)
        ended = [w for w in first if w.returncode is None and w.check_exit()]
        return ended + [w for w in self._workers if w.returncode is None and w.check_exit()]


class SignalTrap:
    """Turns SIGTERM/SIGINT/SIGHUP into requests the watch loop acts on (main thread only)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller must forward signals
                return

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received.append(signum)


def open_pidfd(pid: int) -> int | None:
    """A pidfd of `pid` for `ExitWaiter`: readable once the process exits."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: plain polling
        return None
