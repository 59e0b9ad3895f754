"""The supervisor of a detached job: `python -m ringflow.launch.supervisor run|follow|stop`.

`run` starts one command (a launcher agent, mpirun, poprun) in its own session and stays
with it, detached from whoever started it: it appends the command's output to the job
folder's output.log, keeps status.json current, and stops the job (TERM to its process
group, KILL after a grace, every process that carries the job's marker, its shared memory)
when asked to (`stop`, SIGTERM), or when its lease runs out: nobody renewed it for
`--lease-timeout` seconds, so whoever started the job has forgotten it. Secrets come as the
first line of stdin (JSON, `ringflow.launch.stdin`) and go to the command's environment or
its stdin; they are never written anywhere. `follow` and `stop` are
`ringflow.launch.follow`. The folder's layout is `jobdir`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets as token_source
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from ringflow.errors import ConfigError
from ringflow.launch import jobdir
from ringflow.launch.exits import describe_exit
from ringflow.launch.follow import follow_main, marked_processes, stop_main
from ringflow.launch.processes import (
    Prctl,
    describe_returncode,
    exit_status,
    live_groups,
    reap_orphans,
    signal_group,
    terminate_group,
)
from ringflow.launch.stdin import encode_secrets, envelope_parts, read_envelope

PROG = "python -m ringflow.launch.supervisor"
STARTED_PREFIX = "ringflow-job "    # the line `run --detach` prints once the job runs
DEFAULT_GRACE_S = 10.0   # an agent takes up to its own grace (5 s) to stop its ranks
READY_TIMEOUT_S = 30.0
TICK_S = 0.2
LEASE_CHECK_S = 1.0
DRAIN_S = 5.0            # after the command exits: how long a descendant may hold its pipe
KILL_WAIT_S = 5.0
_READ_BYTES = 1 << 16


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _seconds_or_none(text: str) -> float | None:
    if text.strip().lower() in ("none", "never", ""):
        return None
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="start a command as a supervised job")
    run.add_argument("--job-dir", required=True, type=Path)
    run.add_argument("--lease-timeout", type=_seconds_or_none, default=None, metavar="S",
                     help="stop the job when its lease is S seconds old (default: never)")
    run.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="S",
                     help="seconds between SIGTERM and SIGKILL when stopping")
    run.add_argument("--secrets", choices=("none", "env", "stdin"), default="none",
                     help="the first stdin line holds secret variables: put them into the "
                          "command's environment (env), or pass the line on as the first "
                          "line of its stdin, which then stays open (stdin)")
    run.add_argument("--detach", action="store_true",
                     help="return once the job runs; the supervisor goes on in its own session")
    run.add_argument("command", nargs=argparse.REMAINDER)
    follow = sub.add_parser("follow", help="stream output.log until the job ends")
    follow.add_argument("--job-dir", required=True, type=Path)
    follow.add_argument("--offset", type=int, default=0)
    follow.add_argument("--renew", action="store_true", help="renew the lease while following")
    follow.add_argument("--tie", action="store_true",
                        help="stop the job when this command's stdin ends")
    stop = sub.add_parser("stop", help="stop the job")
    stop.add_argument("--job-dir", required=True, type=Path)
    stop.add_argument("--why", default="stopped on request")
    stop.add_argument("--wait", type=float, default=0.0, metavar="S",
                      help="wait up to S seconds for the job to end")
    return p


# -- run ---------------------------------------------------------------------------------
class Supervisor:
    """One job: the command, its folder, its lease; `run()` returns its exit code."""

    def __init__(self, job_dir: Path, command: list[str], env: dict[str, str],
                 stdin_line: bytes | None, lease_timeout: float | None,
                 grace_s: float, secrets: list[str] | None = None) -> None:
        self.dir = job_dir
        self.secrets = list(secrets or [])  # masked in output.log, never written
        self.command = command
        self.env = env
        self.stdin_line = stdin_line
        self.lease_timeout = lease_timeout
        self.grace_s = grace_s
        self.marker = env[jobdir.MARKER_VAR]
        self.proc: subprocess.Popen | None = None
        self.status: dict = {
            "version": jobdir.STATUS_VERSION, "state": jobdir.STARTING,
            "host": socket.gethostname(), "boot_id": jobdir.boot_id(),
            "supervisor_pid": os.getpid(), "pid": None, "pgid": None,
            "job_id": env.get("RINGFLOW_JOB_ID"), "program": program_name(command),
            "started_at": time.time(), "ended_at": None, "exit_code": None, "cause": None,
            "stopped_by": None, "lease_timeout_s": lease_timeout, "marker": self.marker}
        self._stop: tuple[str, str] | None = None  # (by, why) once a stop began
        self._stop_deadline: float | None = None
        self._signals: list[int] = []

    def start(self) -> None:
        """Start the command; OSError if it cannot be started."""
        self.status["supervisor_pid"] = os.getpid()  # after a --detach fork: the child's
        self._write_status()
        jobdir.renew_lease(self.dir)
        self.proc = subprocess.Popen(
            self.command, env=self.env, start_new_session=True,
            stdin=subprocess.PIPE if self.stdin_line is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            # the command gets SIGTERM if the supervisor dies (stops gracefully: an agent
            # stops its ranks); its stdin pipe, if any, ends too
            preexec_fn=Prctl().child_setup(os.getpid(), signal.SIGTERM))
        if self.stdin_line is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(self.stdin_line)
                self.proc.stdin.flush()
        self.status.update(state=jobdir.RUNNING, pid=self.proc.pid, pgid=self.proc.pid)
        self._write_status()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: self._signals.append(signum))
        assert self.proc is not None
        pipes = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        for fd in pipes:
            os.set_blocking(fd, False)
        out = os.open(self.dir / jobdir.OUTPUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            return self._watch(pipes, jobdir.OutputWriter(out, self.secrets))
        finally:
            os.close(out)

    def _watch(self, pipes: dict[int, str], output: jobdir.OutputWriter) -> int:
        returncode: int | None = None
        drain_until = float("inf")
        next_lease_check = 0.0
        while True:
            if pipes:
                ready, _, _ = select.select(list(pipes), [], [], TICK_S)
                for fd in ready:
                    if not self._copy(fd, pipes[fd], output):
                        del pipes[fd]
            else:
                time.sleep(TICK_S)
            if returncode is None:
                returncode = self._exited()
                if returncode is not None:
                    drain_until = time.monotonic() + DRAIN_S
            if returncode is not None and (not pipes or time.monotonic() > drain_until):
                output.flush()
                return self._finish(returncode)
            if self._signals and self._stop is None:
                name = signal.Signals(self._signals[0]).name
                self._begin_stop("request", self._stop_reason(f"the supervisor got {name}"))
            if time.monotonic() >= next_lease_check:
                next_lease_check = time.monotonic() + LEASE_CHECK_S
                self._check_lease()
            self._escalate()

    def _copy(self, pipe: int, stream: str, output: jobdir.OutputWriter) -> bool:
        """Move what the command printed to output.log; False at the pipe's end."""
        try:
            data = os.read(pipe, _READ_BYTES)
        except BlockingIOError:
            return True
        if not data:
            return False
        output.feed(stream, data)
        return True

    def _exited(self) -> int | None:
        assert self.proc is not None
        return exit_status(self.proc.pid)

    def _stop_reason(self, default: str) -> str:
        try:
            text = (self.dir / jobdir.STOP).read_text().strip()
        except OSError:
            return default
        return text or default

    def _check_lease(self) -> None:
        if self.lease_timeout is None or self._stop is not None:
            return
        age = jobdir.lease_age(self.dir)
        if age is None or age > self.lease_timeout:
            self._begin_stop("lease", f"its lease was not renewed for {self.lease_timeout:g} s "
                                      "(nobody watches the job any more)")

    def _begin_stop(self, by: str, why: str) -> None:
        assert self.proc is not None
        self._stop = (by, why)
        self._stop_deadline = time.monotonic() + self.grace_s
        self.status.update(state=jobdir.STOPPING, stopped_by=by, cause=why)
        self._write_status()
        terminate_group(self.proc.pid)

    def _escalate(self) -> None:
        """SIGKILL once the grace after a stop's SIGTERM ran out (or at a second signal)."""
        if self._stop_deadline is None:
            return
        if time.monotonic() > self._stop_deadline or len(self._signals) > 1:
            self._stop_deadline = None
            self._kill_everything(signal.SIGKILL)

    def _kill_everything(self, sig: int) -> None:
        assert self.proc is not None
        if live_groups([self.proc.pid]):
            signal_group(self.proc.pid, sig)
        for pid in marked_processes(self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _finish(self, returncode: int) -> int:
        """The command ended: what is left of the job is stopped, its shm swept, and the
        status says how it ended."""
        assert self.proc is not None
        left = marked_processes(self.marker)
        if left or live_groups([self.proc.pid]):
            self._kill_everything(signal.SIGTERM)
            deadline = time.monotonic() + min(self.grace_s, 5.0)
            while (marked_processes(self.marker) or live_groups([self.proc.pid])) and \
                    time.monotonic() < deadline:
                reap_orphans({self.proc.pid})
                time.sleep(0.05)
            self._kill_everything(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=KILL_WAIT_S)
        reap_orphans(set())
        self._end_output_with_newline()
        removed = sweep_shm(self.status.get("job_id"))
        code, _ = describe_returncode(returncode)
        cause = self.status.get("cause") if self._stop else None
        self.status.update(state=jobdir.ENDED, ended_at=time.time(), exit_code=code,
                           cause=cause or f"{self.status['program']} {ended_how(returncode)}",
                           shm_removed=removed)
        self._write_status()
        return code

    def _end_output_with_newline(self) -> None:
        """Once the job ended every line of output.log is whole: a watcher that shows whole
        lines only then shows all of it."""
        path = self.dir / jobdir.OUTPUT
        with contextlib.suppress(OSError), open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")

    def _write_status(self) -> None:
        jobdir.write_json(self.dir / jobdir.STATUS, self.status)


def ended_how(returncode: int) -> str:
    """``ended with exit code 1``, ``was killed by SIGTERM (exit code 143)``."""
    text = describe_exit(returncode)
    return f"was {text}" if returncode < 0 else f"ended with {text}"


def program_name(command: list[str]) -> str:
    """What a person calls the command: the module of `python -m module`, else its name."""
    if "-m" in command[1:-1]:
        return command[command.index("-m", 1) + 1]
    return os.path.basename(command[0])


def sweep_shm(job_id: str | None) -> list[str]:
    if not job_id:
        return []
    from ringflow.launch.shm import sweep_job_segments

    try:
        return sweep_job_segments(job_id)
    except (OSError, ConfigError):
        return []


def run_main(ns: argparse.Namespace) -> int:
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        raise ConfigError("run: no command after --")
    job_dir = jobdir.make_dir(ns.job_dir.expanduser())
    if (job_dir / jobdir.OUTPUT).exists() or jobdir.supervisor_alive(job_dir):
        raise ConfigError(f"run: job folder {job_dir} holds a job already")
    values, masks = read_envelope() if ns.secrets != "none" else ({}, [])
    env = dict(os.environ)
    env[jobdir.MARKER_VAR] = token_source.token_hex(12)
    stdin_line = None
    if ns.secrets == "env":
        env.update(values)
    elif ns.secrets == "stdin":
        stdin_line = encode_secrets(values)
    hidden = [part for name, value in values.items() for part in envelope_parts(name, value)]
    supervisor = Supervisor(job_dir, command, env, stdin_line, ns.lease_timeout, ns.grace,
                            [*hidden, *masks])
    if ns.detach:
        return _detach(supervisor)
    lock = jobdir.hold_lock(job_dir)
    try:
        supervisor.start()
        return supervisor.run()
    finally:
        os.close(lock)


def _detach(supervisor: Supervisor) -> int:
    """Fork: the child becomes a session leader with its stdio off the caller's (an SSH
    channel may close at once) and runs the job; the parent prints the job's line once the
    command runs, or the error if it could not start, and returns."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return _report_start(read_end, pid)
    os.close(read_end)
    code = 1
    try:
        os.setsid()
        _detach_stdio(supervisor.dir)
        lock = jobdir.hold_lock(supervisor.dir)
        Prctl().become_subreaper()
        try:
            supervisor.start()
        except OSError as exc:
            os.write(write_end, json.dumps({"error": f"cannot start {supervisor.command[0]!r}: "
                                                     f"{exc}"}).encode())
            os._exit(1)
        os.write(write_end, json.dumps({k: supervisor.status[k] for k in (
            "pid", "pgid", "supervisor_pid", "host", "boot_id", "job_id")}).encode())
        os.close(write_end)
        code = supervisor.run()
        os.close(lock)
    except BaseException:  # a detached process has nowhere else to say it
        import traceback

        traceback.print_exc()
    os._exit(code)


def _detach_stdio(job_dir: Path) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    own = os.open(job_dir / jobdir.OWN_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(own, 2)
    os.close(null)
    os.close(own)


def _report_start(read_end: int, pid: int) -> int:
    deadline = time.monotonic() + READY_TIMEOUT_S
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_end], [], [], TICK_S)
        if ready:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    os.close(read_end)
    try:
        said = json.loads(data) if data else {"error": "the supervisor ended before the job "
                                                       "started"}
    except ValueError:
        said = {"error": "the supervisor said something unreadable at start"}
    if "error" in said:
        print(f"{PROG}: error: {said['error']}", file=sys.stderr)
        return 1
    print(STARTED_PREFIX + json.dumps(said, sort_keys=True), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        if ns.action == "run":
            return run_main(ns)
        if ns.action == "follow":
            return follow_main(ns)
        return stop_main(ns)
    except (ConfigError, PermissionError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
