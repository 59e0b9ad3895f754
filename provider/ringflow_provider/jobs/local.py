"""LocalJob: a command on this host, run as a child process that leads its own session and
process group, streamed as whole lines, stopped as a group, and tied to its owner by stdin.

stdin is a pipe this process holds open for the job's whole life: the job may read an
optional first line from it (a launcher started with `--stdin` reads its secrets there) and
sees EOF the moment the owner dies, even by SIGKILL, since the kernel then closes the pipe.
That is what ties a job to an Airflow task process; a command that never reads stdin is not
tied. The leader is not reaped while its group may still be signalled (its exit is seen
through a pidfd, or waitid with WNOWAIT), so the group id cannot be reused by a stranger.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType

from ringflow.errors import LaunchError
from ringflow.launch.processes import (
    describe_returncode,
    exit_status,
    live_groups,
    signal_group,
    terminate_group,
)
from ringflow_provider.jobs.lines import TAIL_LINES, LineSink, LineSplitter

DEFAULT_GRACE_S = 5.0
DRAIN_S = 5.0  # after the leader exits: how long a descendant may hold its pipes open
STDIN_WRITE_S = 10.0
KILL_WAIT_S = 5.0  # after SIGKILL only a process stuck in the kernel takes longer
_TICK_S = 0.2
_POLL_S = 0.05
_READ_BYTES = 65536


def _stdin_bytes(line: str | bytes | None) -> bytes | None:
    if line is None:
        return None
    data = line.encode() if isinstance(line, str) else bytes(line)
    data = data if data.endswith(b"\n") else data + b"\n"
    if b"\n" in data[:-1]:  # the value itself is not quoted: it may be a secret
        raise ValueError("stdin_line must be one line (no newline before its end)")
    return data


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3: exits are polled
        return None


class LocalJob:
    """One command run as its own session and process group on this host.

    :param argv: the command and its arguments (no shell)
    :param on_line: called as ``on_line(stream, line)`` for every whole output line
        ("stdout" or "stderr"), in the thread that calls :meth:`wait`, with the line as the
        job printed it (mask it before logging); an exception it raises leaves ``wait``
    :param env: the job's whole environment (None: this process's)
    :param cwd: its working directory
    :param stdin_line: written to the job's stdin as its first line (e.g. the secrets line
        of ``ringflow.launch --stdin``); never logged, never on a command line
    :param grace_s: seconds between SIGTERM and SIGKILL when the job is stopped
    """

    def __init__(self, argv: Sequence[str], on_line: LineSink, *,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 stdin_line: str | bytes | None = None,
                 grace_s: float = DEFAULT_GRACE_S) -> None:
        if not argv:
            raise ValueError("argv must name a command")
        if not grace_s > 0:
            raise ValueError(f"grace_s must be > 0, got {grace_s}")
        self.argv = [os.fspath(a) for a in argv]
        self.on_line = on_line
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self.grace_s = grace_s
        self.exit_code: int | None = None  # shell style: 128+N when signal N ended it
        self._stdin_line = _stdin_bytes(stdin_line)
        self._proc: subprocess.Popen | None = None
        self._pidfd: int | None = None
        self._selector: selectors.BaseSelector | None = None
        self._pipes: dict[int, LineSplitter] = {}  # output pipes not at their end yet
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._returncode: int | None = None  # Popen style, seen without reaping
        self._drain_until = 0.0
        self._stop_requested = False
        self._killer: threading.Thread | None = None
        self._killer_done = False
        self._closed = False
        self._reap_lock = threading.Lock()  # who reaps the leader: close() or the killer

    def __repr__(self) -> str:  # no stdin line, no environment
        return f"LocalJob({self.argv[0]!r}, pid={self.pid}, exit_code={self.exit_code})"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def pgid(self) -> int | None:
        """The job's process group (and session) id: the leader's pid."""
        return self.pid

    @property
    def tail(self) -> list[str]:
        """The last lines of stdout and stderr, in the order they came."""
        return list(self._tail)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    # -- start ---------------------------------------------------------------------------

    def start(self) -> int:
        """Start the job; returns its pid (= its process group id). LaunchError if it
        cannot start, was started already, or was stopped before it started."""
        if self._proc is not None:
            raise LaunchError(f"{self!r} was started already")
        if self._stop_requested:
            raise LaunchError(f"{self.argv[0]!r} was stopped before it started")
        try:
            self._proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise LaunchError(f"cannot start {self.argv[0]!r}: {exc}") from exc
        self._pidfd = _pidfd(self._proc.pid)
        self._selector = selectors.DefaultSelector()
        for stream, pipe in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            self._pipes[fd] = LineSplitter(stream, self.on_line, self._tail)
            self._selector.register(fd, selectors.EVENT_READ)
        if self._pidfd is not None:
            self._selector.register(self._pidfd, selectors.EVENT_READ)
        if self._stdin_line is not None:
            line, self._stdin_line = self._stdin_line, None
            self._write_stdin(line)
        return self._proc.pid

    def _write_stdin(self, line: bytes) -> None:
        fd = self._proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(line)
        deadline = time.monotonic() + STDIN_WRITE_S
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stop()
                    raise LaunchError(f"{self.argv[0]!r} (pid {self.pid}) did not read its "
                                      f"first stdin line within {STDIN_WRITE_S:g} s; "
                                      "stopping it") from None
                select.select([], [fd], [], left)
            except BrokenPipeError:
                return  # it ended or closed stdin: wait() reports how it ended

    # -- wait ----------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> int | None:
        """Stream output to `on_line` until the job has ended; returns its exit code (128+N
        for signal N), or None if `timeout` seconds passed first. After the leader exits,
        output is read until the pipes end, or for at most DRAIN_S if a descendant holds
        them open."""
        if self._proc is None:
            raise LaunchError("wait() before start()")
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exit_code is None and not self._closed:
            tick = _TICK_S if self._pidfd is not None or self._returncode is not None \
                else _POLL_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                tick = min(tick, left)
            self._step(tick)
        return self.exit_code

    def _step(self, timeout_s: float) -> None:
        for key, _ in self._selector.select(timeout_s):
            if key.fd in self._pipes:
                self._read(key.fd)
        if self._returncode is None:
            self._returncode = exit_status(self._proc.pid)
            if self._returncode is not None:
                self._drain_until = time.monotonic() + DRAIN_S
                if self._pidfd is not None:  # readable for good now: stop selecting it
                    self._selector.unregister(self._pidfd)
        if self._returncode is not None and (
                not self._pipes or time.monotonic() > self._drain_until):
            self._finish()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        splitter = self._pipes[fd]
        if data:
            splitter.feed(data)
            return
        self._selector.unregister(fd)
        del self._pipes[fd]
        splitter.flush()

    def _finish(self) -> None:
        for fd, splitter in list(self._pipes.items()):  # held open by a descendant
            self._selector.unregister(fd)
            del self._pipes[fd]
            splitter.flush()
        self.exit_code, _ = describe_returncode(self._returncode)
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        if not live_groups([self._proc.pid]):
            self._proc.wait()  # reaps at once: it has exited

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> str:
        """SIGTERM (and SIGCONT) to the job's process group now, SIGKILL after `grace_s` if
        any member still lives; returns at once (the SIGKILL comes from a daemon thread),
        so it may be called from a signal handler such as Airflow's on_kill. Says what it
        did."""
        self._stop_requested = True
        if self._proc is None:
            return "not started; it will not start"
        pgid = self._proc.pid
        if self._killer is not None:
            return f"already stopping process group {pgid}"
        if not live_groups([pgid]):
            return f"process group {pgid} has already ended"
        terminate_group(pgid)
        self._killer = threading.Thread(target=self._kill_after_grace, args=(pgid,),
                                        name=f"ringflow-stop-{pgid}", daemon=True)
        self._killer.start()
        return f"sent SIGTERM to process group {pgid}; SIGKILL in {self.grace_s:g} s if it " \
               "still runs"

    def _kill_after_grace(self, pgid: int) -> None:
        deadline = time.monotonic() + self.grace_s
        while live_groups([pgid]):
            if time.monotonic() >= deadline:
                signal_group(pgid, signal.SIGKILL)
                break
            time.sleep(_POLL_S)
        deadline = time.monotonic() + KILL_WAIT_S
        while live_groups([pgid]) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        with self._reap_lock:
            self._killer_done = True
            closed = self._closed
        if closed:  # close() came first and left the leader to us
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=KILL_WAIT_S)

    # -- close ---------------------------------------------------------------------------

    def close(self) -> None:
        """Done with the job: stop what still runs in its group (as :meth:`stop`) and release
        its pipes; returns at once. A `with` block calls it."""
        if self._closed or self._proc is None:
            self._closed = True
            return
        if live_groups([self._proc.pid]):
            self.stop()
        with self._reap_lock:  # from now on the killer, if any is running, reaps
            self._closed = True
            killer_done = self._killer is None or self._killer_done
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError):
                pipe.close()
        if self._selector is not None:
            self._selector.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if killer_done and self._proc.returncode is None and not live_groups([self.pgid]):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=KILL_WAIT_S)  # it has exited: reaps at once

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
