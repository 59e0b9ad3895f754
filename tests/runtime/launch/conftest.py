"""Launcher test harness: real launcher processes, and a guarantee that nothing they started
outlives the test (checked through /proc and /dev/shm, then killed so one failure cannot
leak into the next test)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from ringflow.launch.result import parse_result_line
from tests import procs

MARK_VAR = "RINGFLOW_TEST_MARK"  # inherited by every descendant of a launcher a test starts


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict:
        """The agent's final `[launch] result {...}` line, parsed."""
        for line in reversed(self.stdout.splitlines()):
            value = parse_result_line(line)
            if value is not None:
                return value
        raise AssertionError(f"no result line in stdout:\n{self.stdout}\n{self.stderr}")

    def lines(self, prefix: str) -> list[str]:
        return [ln[len(prefix):] for ln in self.stdout.splitlines() if ln.startswith(prefix)]


def marked_processes(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries `mark`."""
    return procs.marked_processes(MARK_VAR, mark)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Launcher:
    """Starts `python -m ringflow.launch` in tmp_path, each in its own session."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.mark = uuid.uuid4().hex
        self.job_id = "t" + uuid.uuid4().hex[:12]
        self.token = "tok" + uuid.uuid4().hex + uuid.uuid4().hex
        self.procs: list[subprocess.Popen] = []

    def script(self, name: str, body: str) -> Path:
        path = self.dir / name
        path.write_text(textwrap.dedent(body))
        return path

    def env(self, identity: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RINGFLOW_", "PADDLE_"))}
        env[MARK_VAR] = self.mark
        if identity:
            env["RINGFLOW_JOB_ID"] = self.job_id
            env["RINGFLOW_JOB_TOKEN"] = self.token
        env.update(extra)
        return env

    def start(self, *args: str, env: dict[str, str] | None = None,
              command: list[str] | None = None, stdin: int | None = None) -> subprocess.Popen:
        argv = (command or [sys.executable, "-m", "ringflow.launch"]) + list(args)
        proc = subprocess.Popen(argv, cwd=self.dir, env=env or self.env(), stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = 30.0) -> Finished:
        if proc.stdin is not None and proc.stdin.closed:
            proc.stdin = None  # a test closed it (the end of input); communicate cannot
        out, err = proc.communicate(timeout=timeout)
        return Finished(proc.returncode, out.decode(errors="replace"),
                        err.decode(errors="replace"))

    def run(self, *args: str, timeout: float = 30.0, **kw) -> Finished:
        return self.finish(self.start(*args, **kw), timeout)

    def read_json(self, name: str, timeout: float = 15.0) -> dict:
        path = self.dir / name
        wait_for(lambda: path.exists() and path.read_text().endswith("\n"), timeout,
                 f"{path} to be written")
        return json.loads(path.read_text())

    def cleanup(self) -> list[int]:
        """Kill whatever a test left; returns the pids that were still alive."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.stdin is not None and proc.stdin.closed:
                proc.stdin = None
            proc.communicate(timeout=10)
        leftovers = marked_processes(self.mark)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return leftovers


@pytest.fixture
def launcher(tmp_path):
    """A Launcher; the test fails if any process it started or any shm segment of its job
    is still there afterwards (the watchdog of a killed launcher gets a few seconds)."""
    harness = Launcher(tmp_path)
    try:
        yield harness
    finally:
        settled = _settle(harness.mark, timeout=8.0)
        leftovers = harness.cleanup()
        shm = sorted(p.name for p in Path("/dev/shm").glob(f"ringflow-{harness.job_id}-*"))
        for name in shm:
            Path("/dev/shm", name).unlink(missing_ok=True)
    assert settled and not leftovers, f"processes left behind: {leftovers}"
    assert not shm, f"shared-memory segments left behind: {shm}"


def _settle(mark: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while marked_processes(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
