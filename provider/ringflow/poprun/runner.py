"""Running one PopRun job on CPU hosts: mpirun started, its output joined into whole tagged
lines, signals forwarded, the first failing instance named, a failed job's shared memory
swept on every host.

mpirun does the rest as poprun relies on it to: a non-zero exit or a signal of any instance
stops all the others, and mpirun's exit code is the first failing instance's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Protocol

from ringflow.errors import ConfigError, LaunchError
from ringflow.launch.env import JOB_ID_VAR, JOB_TOKEN_VAR, resolve_identity
from ringflow.poprun.args import PopRunArgs
from ringflow.poprun.leftovers import Watchdog, ancestors, job_processes, stop_processes
from ringflow.poprun.mpirun import (
    EXIT_LINE,
    RANK_EXIT_LINE,
    OutputJoiner,
    exported_values,
    mpirun_argv,
)

__all__ = ["Lifeline", "PopRunJob", "topology_lines"]

PREFIX = "ringflow-poprun:"
STOP_GRACE_S = 15  # mpirun's own TERM-then-KILL takes a few seconds; then we SIGKILL it
OUTPUT_QUEUE_LINES = 10000  # lines waiting for a slow reader before mpirun is held back
LEFT_GRACE_S = 2  # this host's instances that outlived mpirun: SIGTERM, then SIGKILL
DRAIN_S = 5  # output still in the pipes after mpirun's exit
SWEEP_TIMEOUT_S = 30
_PR_SET_PDEATHSIG = 1
# mpirun's report of the first failure (Open MPI 4 and 5).
_FAILED_RANK = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_FAILED_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal "
                        r"(\d+)(?: \(([^)]*)\))?")
_SWEEP = ("import sys\nfrom ringflow.launch.shm import sweep_job_segments\n"
          "removed = sweep_job_segments(sys.argv[1])\n"
          "print('removed shm segments ' + ' '.join(removed) if removed else "
          "'no shm segment of the job left')\n")


class Lifeline(Protocol):
    """Something whose end means: stop the job (`ringflow.launch.stdin.StdinWatch`)."""

    ended: threading.Event
    reason: str

    def start(self) -> None: ...


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _how(exit_code: int) -> str:
    """An exit code as a person reads it; sh reports a program ended by signal N as 128+N."""
    if 128 < exit_code < 128 + 65:
        return f"exit code {exit_code} (ended by {_signal_name(exit_code - 128)})"
    return f"exit code {exit_code}"


def topology_lines(args: PopRunArgs) -> list[str]:
    """--print-topology: which instance runs where with which replicas."""
    local = args.replicas // args.num_instances
    lines = [f"{'host':<24} {'instance':>8} {'replicas':>12}"]
    for instance in range(args.num_instances):
        first = instance * local
        replicas = f"{first}" if local == 1 else f"{first}-{first + local - 1}"
        lines.append(f"{args.host_of(instance):<24} {instance:>8} {replicas:>12}")
    return lines


def _parent_death_sigterm() -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def setup() -> None:
        # mpirun, told by SIGTERM, stops every instance on every host: so if this process is
        # SIGKILLed, mpirun still gets the signal it needs to clean up.
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return setup


class PopRunJob:
    """One run of `args` under mpirun; `run()` returns the exit code.

    mpirun leaves this host's instances running if it dies abruptly (see `leftovers`): any
    process of the job that outlives mpirun is stopped, and a watchdog stops them if this
    process itself is SIGKILLed. Instances on other hosts are children of Open MPI's orted
    there, which ends them when it loses mpirun.
    """

    prefix = PREFIX  # starts this job's own lines

    def __init__(self, args: PopRunArgs, environ: Mapping[str, str] | None = None,
                 stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 mpirun: str = "mpirun", lifeline: Lifeline | None = None) -> None:
        """`lifeline`, when given, is started once mpirun runs; when it ends the job is
        stopped as on SIGTERM, with exit code 129."""
        self.args = args
        self.lifeline = lifeline
        self.environ = dict(os.environ if environ is None else environ)
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.mpirun = mpirun
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop_cause: str | None = None  # why the job is being stopped from here
        self._stop_code = 0
        self._gone: set[IO[str]] = set()  # output streams whose reader went away
        self._out: queue.Queue[tuple[IO[str], str] | None] = queue.Queue(OUTPUT_QUEUE_LINES)
        self._out_closed = False
        self._dropped = 0
        self._token = ""
        # started once mpirun is (no thread may exist at a fork with a preexec_fn)
        self._writer_thread = threading.Thread(target=self._writer, daemon=True,
                                               name="ringflow-poprun-output")
        self._mpirun_said: list[str] = []
        self._watchdog: Watchdog | None = None
        self._exits: list[tuple[float, int, int]] = []
        self._began_exit: dict[int, float] = {}
        self._after_peer_failure: set[int] = set()  # instances that reported seeing one

    # output -------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self._write(self.stdout, f"{self.prefix} {text}")

    def _write(self, stream: IO[str], line: str) -> None:
        """Queue a line for the writer thread. mpirun's pipes must always be drained: once
        the job is being stopped, a line that finds the queue full (our reader stalls) is
        dropped, or mpirun would block writing and could not stop the instances."""
        while True:
            try:
                self._out.put((stream, line), timeout=0.2)
                return
            except queue.Full:
                if self._stop_cause is not None or self._out_closed:
                    self._dropped += 1
                    return

    def _writer(self) -> None:
        while (item := self._out.get()) is not None:
            stream, line = item
            if stream in self._gone:
                continue
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):  # whoever read it is gone (a closed SSH channel)
                self._gone.add(stream)

    def _start_writer(self) -> None:
        if not self._writer_thread.is_alive() and self._writer_thread.ident is None:
            self._writer_thread.start()

    def _close_output(self) -> None:
        """The queued lines written, within DRAIN_S; then the writer ends."""
        self._start_writer()
        self._out_closed = True
        if self._dropped:
            self._write(self.stdout, f"{self.prefix} {self._dropped} line(s) of output were "
                                     f"dropped while the job stopped (the reader stalled)")
        try:
            self._out.put(None, timeout=DRAIN_S)
        except queue.Full:
            return
        self._writer_thread.join(DRAIN_S)

    def _emitter(self, name: str, stream: IO[str]) -> Callable[[int | None, str], None]:
        only = self.args.only_output_from_instance

        def emit(instance: int | None, line: str) -> None:
            if instance is not None and name == "stderr":
                reported = EXIT_LINE.match(line)
                if reported:  # the instance's sh: (exit time, instance, exit code)
                    self._exits.append((float(reported.group(2)), instance,
                                        int(reported.group(1))))
                    return
                began = RANK_EXIT_LINE.match(line)
                if began:  # a ringflow worker about to close its rings
                    self._began_exit.setdefault(instance, float(began.group(1)))
                    if began.group(2):
                        self._after_peer_failure.add(instance)
                    return
            if instance is None:
                if name == "stderr":
                    self._mpirun_said.append(line)
                self._write(stream, line)
            elif only is None or instance == only:
                self._write(stream, f"[1,{instance}]<{name}>:{line}")

        return emit

    def _pump(self, pipe: IO[bytes], joiner: OutputJoiner) -> None:
        fd = pipe.fileno()
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            joiner.feed(data)
        joiner.close()

    # the job ------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._close_output()

    def _run(self) -> int:
        env = dict(self.environ)
        given_id = exported_values(self.args.mpi_local_args).get(JOB_ID_VAR)
        if given_id:  # the job's id on the command line (PopRunOperator's ringflow_job)
            env[JOB_ID_VAR] = given_id
        identity, warning = resolve_identity(env)
        if warning:
            self.say(f"warning: {warning}")
        env[JOB_ID_VAR], env[JOB_TOKEN_VAR] = identity.job_id, identity.token
        self._token = identity.token
        args = self.args
        self.say(self.intro(identity.job_id))
        if args.ignored:
            self.say("IPU-only options accepted and ignored: " + " ".join(args.ignored))
        if args.print_topology:
            for line in topology_lines(args):
                self.say(line)
        argv = mpirun_argv(args, env, self.mpirun)
        if args.verbose:
            self.say("mpirun command: " + " ".join(argv))
        try:
            self._watchdog = Watchdog(identity.token, LEFT_GRACE_S)
        except LaunchError as exc:
            self.say(f"warning: {exc}; instances here would outlive a SIGKILL of this process")
        try:
            code = self._run_mpirun(argv, env)
        finally:
            self._stop_leftovers(identity.token)
        if code != 0:
            code = self._first_failure(code)
            self._sweep(identity.job_id, env)
        return code

    def intro(self, job_id: str) -> str:
        args = self.args
        return (f"{args.num_instances} instance(s) on {len(args.hosts)} host(s) "
                f"({','.join(args.hosts)}, {args.per_host} each), {args.replicas} replica(s); "
                f"job {job_id}; Open MPI's mpirun runs them (CPU, no IPUs)")

    def _run_mpirun(self, argv: list[str], env: dict[str, str]) -> int:
        previous = {sig: signal.signal(sig, self._forward)
                    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            try:
                self._proc = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, preexec_fn=_parent_death_sigterm())
            except FileNotFoundError:
                raise ConfigError(f"{self.mpirun!r} not found: ringflow-poprun runs the "
                                  "instances with Open MPI's mpirun (Debian: apt install "
                                  "openmpi-bin)") from None
            assert self._proc.stdout is not None and self._proc.stderr is not None
            self._start_writer()
            pumps = [threading.Thread(target=self._pump, daemon=True, args=(
                pipe, OutputJoiner(self._emitter(name, stream))))
                for pipe, name, stream in ((self._proc.stdout, "stdout", self.stdout),
                                           (self._proc.stderr, "stderr", self.stderr))]
            for pump in pumps:
                pump.start()
            if self.lifeline is not None:
                self.lifeline.start()
            code = self._wait()
            deadline = time.monotonic() + DRAIN_S
            for pump in pumps:
                pump.join(max(0.0, deadline - time.monotonic()))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if code < 0:
            code = 128 - code
        if self._stop_cause is not None:
            self.say(f"stopped by {self._stop_cause}; mpirun stopped every instance")
            return self._stop_code
        return code

    def _wait(self) -> int:
        proc = self._proc
        assert proc is not None
        stop_by: float | None = None
        while True:
            try:
                return proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if self.lifeline is not None and self.lifeline.ended.is_set():
                self._stop(self.lifeline.reason or "the end of stdin", 129)
            if self._stop_cause is not None and stop_by is None:
                stop_by = time.monotonic() + STOP_GRACE_S
            if stop_by is not None and time.monotonic() > stop_by:
                self.say(f"mpirun did not stop within {STOP_GRACE_S} s of SIGTERM: SIGKILL")
                proc.kill()
                return proc.wait(timeout=STOP_GRACE_S)

    def _stop_leftovers(self, token: str) -> None:
        left = job_processes(token, exclude=ancestors())
        if left:
            self.say(f"{len(left)} process(es) of the job outlived mpirun here: stopping them")
            survivors = stop_processes(left, LEFT_GRACE_S)
            if survivors:
                self.say(f"processes still alive after SIGKILL: {survivors}")
        if self._watchdog is not None:
            self._watchdog.release()

    def _forward(self, signum: int, _frame: object) -> None:
        self._stop(f"signal {signal.Signals(signum).name}", 128 + signum)

    def _stop(self, cause: str, code: int) -> None:
        if self._stop_cause is not None:
            return
        self._stop_cause, self._stop_code = cause, code
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)  # mpirun: TERM to all, then KILL
        # mpirun takes about a second to pass the TERM on; this host's instances get it now
        # (their peers elsewhere then fail at once, or get it from mpirun)
        if self._token:
            for pid in job_processes(self._token, exclude=ancestors() | {self._proc.pid}):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)

    # after a failure ----------------------------------------------------------------------
    def _first_failure(self, code: int) -> int:
        """Name the instance that failed first and return the job's exit code: its code.
        An instance whose ringflow worker reported seeing a peer fail first comes after the
        others; then first by the hosts' clocks, not by the order mpirun heard of the
        exits: when a ringflow worker began to exit (before its peers could notice), else
        when the instance's sh saw it end; mpirun's own report when no instance's came."""
        if self._stop_cause is not None:
            return code
        # an instance that saw a peer fail before it did is a consequence, not the cause
        failed = sorted((i in self._after_peer_failure, min(t, self._began_exit.get(i, t)), i, c)
                        for t, i, c in self._exits if c != 0)
        if failed:
            _, _, instance, exit_code = failed[0]
            self.say(f"instance {instance} on {self.args.host_of(instance)} failed first with "
                     f"{_how(exit_code)}; every instance was stopped")
            return exit_code
        said = "\n".join(self._mpirun_said)
        rank, exit_code = _FAILED_RANK.search(said), _FAILED_CODE.search(said)
        signalled = _SIGNALLED.search(said)
        if rank and exit_code:
            instance = int(rank.group(1))
            self.say(f"instance {instance} on {self.args.host_of(instance)} failed first with "
                     f"{_how(int(exit_code.group(1)))}; every instance was stopped")
        elif signalled:
            instance = int(signalled.group(1))
            self.say(f"instance {instance} on {signalled.group(2)} was ended by "
                     f"{_signal_name(int(signalled.group(3)))}; every instance was stopped")
        elif code > 128:
            self.say(f"mpirun was ended by {_signal_name(code - 128)}")
        else:
            self.say(f"mpirun exited with code {code}")
        return code

    def _sweep(self, job_id: str, env: dict[str, str]) -> None:
        """Remove the job's shared memory that killed ringflow workers left, on every host
        (one process per host, under mpirun); best effort, within SWEEP_TIMEOUT_S."""
        hosts = ",".join(f"{host}:1" for host in self.args.hosts)
        argv = [self.mpirun, *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
                "--tag-output", "--bind-to", "none", *self.args.mpi_global_args,
                "-np", str(len(self.args.hosts)), "-H", hosts, "--map-by", "node",
                *(part for name in ("PATH", "PYTHONPATH") if name in env
                  for part in ("-x", name)),
                sys.executable, "-c", _SWEEP, job_id]
        try:
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=SWEEP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.say(f"shm sweep of job {job_id} on the hosts did not finish: {exc}")
            return
        for line in done.stdout.splitlines():
            match = re.match(r"\[\d+,(\d+)\]<stdout>:(.*)", line)
            if match:
                self.say(f"shm sweep on {self.args.hosts[int(match.group(1))]}: "
                         f"{match.group(2)}")
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            self.say(f"shm sweep of job {job_id} failed (exit {done.returncode}): {tail}")
