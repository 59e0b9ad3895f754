"""How a launcher reaches a host: run a short command, or stream a long one whose stdin stays
open as its lifeline. `LocalShell` is this host (a child process); `SSHShell` a host over SSH
(`MultiHostSSHHook`). Commands are POSIX shell text, quoted token by token by whoever builds
them (`launchers.commands`), so both shells run exactly the same text."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from ringflow.errors import LaunchError
from ringflow_provider.jobs.lines import LineSink
from ringflow_provider.jobs.local import LocalJob


class Shell(Protocol):
    host: str

    def run(self, command: str, timeout: float, stdin: str = "") -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of a short command; LaunchError if the host cannot
        be reached or the command outlives `timeout`."""

    def stream(self, command: str, on_line: LineSink,
               should_stop: Callable[[], bool] = lambda: False) -> int:
        """Run `command`, passing each whole output line to `on_line(stream, line)`, until it
        ends (its exit code) or `should_stop()`. Its stdin stays open meanwhile: it ends when
        this process does (the command's way to know its watcher is gone)."""

    def close(self) -> None:
        """Release connections."""


class LocalShell:
    """This host: commands run as children of the task process, under `sh -c`."""

    def __init__(self, host: str, env: Mapping[str, str] | None = None) -> None:
        self.host = host
        self.env = dict(os.environ if env is None else env)
        self._streams: list[LocalJob] = []

    def run(self, command: str, timeout: float, stdin: str = "") -> tuple[int, str, str]:
        try:
            done = subprocess.run(["sh", "-c", command], input=stdin.encode(), env=self.env,
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"this host: {command[:60]!r} did not end within {timeout:g} s") \
                from None
        except OSError as exc:
            raise LaunchError(f"this host: cannot run {command[:60]!r}: {exc}") from exc
        return (done.returncode, done.stdout.decode("utf-8", "replace"),
                done.stderr.decode("utf-8", "replace"))

    def stream(self, command: str, on_line: LineSink,
               should_stop: Callable[[], bool] = lambda: False) -> int:
        with LocalJob(["sh", "-c", command], on_line, env=self.env) as job:
            self._streams.append(job)
            job.start()
            while True:
                code = job.wait(timeout=0.5)
                if code is not None:
                    return code
                if should_stop():
                    return -1

    def close(self) -> None:
        for job in self._streams:
            job.close()
        self._streams.clear()


class SSHShell:
    """A host over SSH with the credentials of one `ssh` connection."""

    def __init__(self, host: str, hook) -> None:  # hook: MultiHostSSHHook (imports paramiko)
        self.host = host
        self.hook = hook

    def run(self, command: str, timeout: float, stdin: str = "") -> tuple[int, str, str]:
        if not stdin:
            return self.hook.run(self.host, command, timeout=timeout)
        deadline = time.monotonic() + timeout
        channel = self.hook.start_command(self.host, command, stdin)
        out: list[str] = []
        err: list[str] = []
        try:
            result = self.hook.pump(self.host, channel,
                                    lambda s, line: (out if s == "stdout" else err).append(line),
                                    lambda: time.monotonic() > deadline)
        finally:
            channel.close()
        if result.exit_code == -1 and time.monotonic() > deadline:
            raise LaunchError(f"host {self.host!r}: {command[:60]!r} did not end within "
                              f"{timeout:g} s")
        return result.exit_code, "\n".join(out), "\n".join(err)

    def stream(self, command: str, on_line: LineSink,
               should_stop: Callable[[], bool] = lambda: False) -> int:
        channel = self.hook.start_command(self.host, command, keep_stdin=True)
        try:
            return self.hook.pump(self.host, channel, on_line, should_stop).exit_code
        finally:
            channel.close()

    def close(self) -> None:
        """The hook is the launcher's (several hosts share one connection's hook)."""
