"""One job under Open MPI's mpirun, as a plan of app contexts describes it: mpirun started,
its output joined into whole tagged lines, signals forwarded, the first failing process
named, a host whose processes went silent given up (what is left there is stopped over SSH:
`ringflow.launch.silent_hosts`), this host's leftovers stopped, a failed job's shared memory
swept on every host (`ringflow.launch.shm_sweep`).

mpirun does the rest as poprun relies on it to: a non-zero exit or a signal of any process
stops all the others, and mpirun's exit code is the first failing process's.
`ringflow.poprun` (PopRun's flags) and `ringflow.launch.mpirun` (one agent per host) run
their jobs with it.
"""

from __future__ import annotations

import contextlib
import os
import secrets as token_source
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Protocol

from ringflow.errors import ConfigError, LaunchError
from ringflow.launch.env import JOB_ID_VAR, JOB_TOKEN_VAR, resolve_identity
from ringflow.launch.exits import describe_exit, describe_signal, shell_exit_code
from ringflow.launch.leftovers import (
    DAEMON_LOST_TAG,
    GIVEN_UP_WORDS,
    ancestors,
    job_processes,
    stop_processes,
)
from ringflow.launch.line_writer import LineWriter
from ringflow.launch.lines import PARTIAL_MARK, Line
from ringflow.launch.openmpi import (
    EXIT_NONCE_VAR,
    ExitReports,
    MpirunPlan,
    OutputJoiner,
    failure_report,
    lost_daemon_node,
    mpirun_argv,
)
from ringflow.launch.processes import Prctl
from ringflow.launch.secret_drop import SecretDrop
from ringflow.launch.shm_sweep import sweep_hosts
from ringflow.launch.silent_hosts import HostStops
from ringflow.launch.watchdog import WatchdogClient

__all__ = ["Lifeline", "MpirunJob"]

STOP_GRACE_S = 15  # mpirun's own TERM-then-KILL takes a few seconds; then we SIGKILL it
LEFT_GRACE_S = 2  # this host's processes that outlived mpirun: SIGTERM, then SIGKILL
DRAIN_S = 5  # output still in the pipes after mpirun's exit
POLL_S = 0.2
# how the job names the processes it gave up on (the provider reads it to name lost hosts)
SILENT_WORDS = "no exit report from process(es)"
# after a process failed, how long mpirun may go on waiting for processes that sent no exit
# report: Open MPI waits for a daemon on a host that vanished until TCP gives up (minutes)
SILENT_GRACE_S = 10.0
SILENT_KILL_S = 2.0  # ... then SIGTERM, and SIGKILL this long after (it waits for them too)


class Lifeline(Protocol):
    """Something whose end means: stop the job (`ringflow.launch.stdin.StdinWatch`)."""

    ended: threading.Event
    reason: str

    def start(self) -> None: ...


class MpirunJob:
    """One run of `plan` under mpirun; `run()` returns the exit code.

    mpirun leaves this host's processes running if it dies abruptly (see `leftovers`): any
    process of the job that outlives mpirun is stopped, and a watchdog stops them if this
    process itself is SIGKILLed. Processes on other hosts are children of Open MPI's orted
    there, which ends them when it loses mpirun. Subclasses say what the job is
    (`intro_lines`) and start their own lines with `prefix`.
    """

    prefix = "[launch] mpirun:"

    def __init__(self, plan: MpirunPlan, environ: Mapping[str, str] | None = None,
                 stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 mpirun: str = "mpirun", lifeline: Lifeline | None = None,
                 only_output_from: int | None = None, verbose: bool = False) -> None:
        """`lifeline`, when given, is started once mpirun runs; when it ends the job is
        stopped as on SIGTERM, with exit code 129. `only_output_from` shows one process's
        output only; `verbose` shows the mpirun command."""
        self.plan = plan
        self.lifeline = lifeline
        self.environ = dict(os.environ if environ is None else environ)
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.mpirun = mpirun
        self.only_output_from = only_output_from
        self.verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop_cause: str | None = None  # why the job is being stopped from here
        self._stop_code = 0
        self._out = LineWriter(stopping=lambda: self._stop_cause is not None)
        self._token = ""
        self._exit_nonce = token_source.token_hex(16)  # what a real exit report carries
        self._mpirun_said: list[str] = []
        self._daemons_lost: set[str] = set()
        self._watchdog: WatchdogClient | None = None
        self._exits = ExitReports(self._exit_nonce)  # what the processes said of their exits
        self.silent: list[int] = []  # processes that never reported after another failed
        # stopping, over SSH, what is left on the hosts given up
        self._host_stops = HostStops(self.environ, lambda: self._token, self.say)

    # output -------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self._out.write(self.stdout, f"{self.prefix} {text}")

    def intro_lines(self, job_id: str) -> list[str]:
        """What the job is, said first."""
        hosts = self.plan.hosts
        return [f"job {job_id}: {len(self.plan.contexts)} process(es) on {len(hosts)} "
                f"host(s) ({','.join(hosts)}), started by Open MPI's mpirun"]

    def _close_output(self) -> None:
        dropped = self._out.dropped
        if dropped:
            self.say(f"{dropped} line(s) of output were dropped while the job stopped (the "
                     "reader stalled)")
        self._out.close(DRAIN_S)

    def _emitter(self, name: str, stream: IO[str]) -> Callable[[int | None, str], None]:
        only = self.only_output_from

        def emit(index: int | None, line: str) -> None:
            whole = isinstance(line, Line) and line.whole
            if index is not None and name == "stderr" and whole and \
                    self._exits.take(index, line):
                return
            if index is None:
                if name == "stderr":
                    self._mpirun_said.append(line)
                self._out.write(stream, line)
                self._say_lost_daemon(line)
            elif only is None or index == only:
                # a piece that is no whole line is marked, so no reader takes it for one
                mark = "" if whole else PARTIAL_MARK
                self._out.write(stream, f"[1,{index}]<{name}>{mark}:{line}")

        return emit

    def _say_lost_daemon(self, line: str) -> None:
        """mpirun lost the daemon of a host (it rebooted, its daemon was killed, the network
        dropped it): say which, once, in a line of this launcher's own (the provider names
        the host from it)."""
        host = lost_daemon_node(line)
        if host is not None and host not in self._daemons_lost:
            self._daemons_lost.add(host)
            self.say(f"{host} {DAEMON_LOST_TAG}: Open MPI's daemon there went away "
                     "(mpirun lost communication with it: the host rebooted or went down, "
                     "or the daemon was killed)")

    @staticmethod
    def _pump(pipe: IO[bytes], joiner: OutputJoiner) -> None:
        fd = pipe.fileno()
        while data := os.read(fd, 65536):
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
        if self.plan.job_id:  # the job's id on the command line (PopRunOperator's ringflow_job)
            env[JOB_ID_VAR] = self.plan.job_id
        identity, warning = resolve_identity(env)
        if warning:
            self.say(f"warning: {warning}")
        env[JOB_ID_VAR], env[JOB_TOKEN_VAR] = identity.job_id, identity.token
        self._token = identity.token
        for line in self.intro_lines(identity.job_id):
            self.say(line)
        # Open MPI would carry the secrets to its daemons in clear: each host gets them over
        # SSH instead, and mpirun never has them
        secrets = {name: env[name] for name in self.plan.secrets if name in env}
        secrets[JOB_TOKEN_VAR] = identity.token
        secrets[EXIT_NONCE_VAR] = self._exit_nonce
        drop = SecretDrop(self.plan.ranks_by_host(), secrets, env, identity.job_id)
        env = {name: value for name, value in env.items() if name not in secrets}
        try:
            drop.deliver()
        except LaunchError as exc:
            self.say(f"error: {exc}")
            return 1
        argv = mpirun_argv(self.plan, env, self.mpirun, secrets_dir=drop.folder)
        if self.verbose:
            self.say("mpirun command: " + " ".join(argv))
        try:
            self._watchdog = WatchdogClient(identity.job_id, LEFT_GRACE_S,
                                            marker=(JOB_TOKEN_VAR, identity.token))
        except LaunchError as exc:
            self.say(f"warning: {exc}; processes here would outlive a SIGKILL of this process")
        try:
            code = self._run_mpirun(argv, env)
        finally:
            self._host_stops.join()
            self._stop_leftovers(identity.token)
            for problem in drop.remove(lost={self.plan.host_of(i) for i in self.silent}):
                self.say(f"warning: {problem}")
        if code != 0:
            code = self._first_failure(code)
            self._sweep(identity.job_id, env)
        return code

    def _run_mpirun(self, argv: list[str], env: dict[str, str]) -> int:
        previous = {sig: signal.signal(sig, self._forward)
                    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            self._proc = self._start_mpirun(argv, env)
            assert self._proc.stdout is not None and self._proc.stderr is not None
            self._out.start()  # threads only now: no fork with a preexec_fn may follow
            pumps = [threading.Thread(target=self._pump, daemon=True, args=(
                pipe, OutputJoiner(self._emitter(name, stream))))
                for pipe, name, stream in ((self._proc.stdout, "stdout", self.stdout),
                                           (self._proc.stderr, "stderr", self.stderr))]
            for pump in pumps:
                pump.start()
            if self.lifeline is not None:
                self.lifeline.start()
            code = shell_exit_code(self._wait())
            deadline = time.monotonic() + DRAIN_S
            for pump in pumps:
                pump.join(max(0.0, deadline - time.monotonic()))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._stop_cause is not None:
            self.say(f"stopped by {self._stop_cause}; mpirun stopped every instance")
            if not self.silent:
                self._stop_unreported()
            return self._stop_code
        return code

    def _start_mpirun(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        # mpirun gets SIGTERM (and stops every process on every host) even if we are SIGKILLed
        try:
            return subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=Prctl().child_setup(os.getpid(), signal.SIGTERM))
        except FileNotFoundError:
            raise ConfigError(f"{self.mpirun!r} not found: ringflow runs the processes with "
                              "Open MPI's mpirun (Debian: apt install openmpi-bin)") from None

    def _wait(self) -> int:
        proc = self._proc
        assert proc is not None
        stop_by: float | None = None
        failed_at: float | None = None
        gave_up = False
        while True:
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            if failed_at is None and self._exits.any_failed():
                failed_at = time.monotonic()
            if failed_at is not None and not gave_up and self._stop_cause is None and \
                    time.monotonic() - failed_at > self._silent_grace():
                gave_up = True
                if not self._give_up_silent(
                        proc, f"{self._silent_grace():g} s after another process failed"):
                    self.say("every process reported its exit; mpirun has not ended: "
                             "stopping it")
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                stop_by = time.monotonic() + SILENT_KILL_S
            if self.lifeline is not None and self.lifeline.ended.is_set():
                self._stop(self.lifeline.reason or "the end of stdin", 129)
            if self._stop_cause is not None and stop_by is None:
                stop_by = time.monotonic() + STOP_GRACE_S
            if stop_by is not None and time.monotonic() > stop_by:
                grace = SILENT_KILL_S if self.silent else STOP_GRACE_S
                self.say(f"mpirun did not stop within {grace:g} s of SIGTERM: SIGKILL")
                proc.kill()
                return proc.wait(timeout=STOP_GRACE_S)

    def _silent_grace(self) -> float:
        """SILENT_GRACE_S, at most a quarter of the ranks' heartbeat timeout (at least 2 s): the
        ranks of a healthy host end about when the first failed one does (each missed the same
        heartbeats)."""
        try:
            heartbeat = float(self.environ.get("RINGFLOW_HEARTBEAT_TIMEOUT") or "nan")
        except ValueError:
            heartbeat = float("nan")
        if not heartbeat > 0:
            return SILENT_GRACE_S
        return min(SILENT_GRACE_S, max(2.0, heartbeat / 4))

    def _give_up_silent(self, proc: subprocess.Popen[bytes], when: str) -> bool:
        """A process failed (or the job is being stopped) and others sent no exit report
        since: their hosts are lost (or hung). Name them and stop mpirun, which would wait
        for their daemons for minutes; what runs on those hosts is stopped over SSH. False
        when every process has reported."""
        silent = self._unreported()
        if not silent:
            return False
        self.silent = silent
        where = ", ".join(f"{i} on {self.plan.host_of(i)}" for i in self.silent)
        self.say(f"{SILENT_WORDS}: {where}, {when} (its host unreachable or hung); "
                 "stopping mpirun")
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        self._host_stops.start([self.plan.host_of(i) for i in self.silent], GIVEN_UP_WORDS)
        return True

    def _stop_unreported(self) -> None:
        """mpirun ended on a stop from here without an exit report from some processes: on
        a frozen host (its daemon frozen with them) or a lost one it could not stop them.
        What is left of the job on their hosts is stopped over SSH."""
        self._host_stops.start([self.plan.host_of(i) for i in self._unreported()],
                               "(after the stop)")

    def _unreported(self) -> list[int]:
        """The processes (by index) that sent no exit report."""
        return self._exits.unreported(len(self.plan.contexts))

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
        # mpirun takes about a second to pass the TERM on; this host's processes get it now
        # (their peers elsewhere then fail at once, or get it from mpirun)
        if self._token:
            for pid in job_processes(self._token, exclude=ancestors() | {self._proc.pid}):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)

    # after a failure ----------------------------------------------------------------------
    def _first_failure(self, code: int) -> int:
        """Name the process that failed first and return the job's exit code: its code.
        By `ExitReports.first_failed` (on the hosts' clocks, not by the order mpirun heard
        of the exits); mpirun's own report when no process's came."""
        if self._stop_cause is not None:
            return code
        first = self._exits.first_failed()
        if first is not None:
            index, exit_code = first
            self._say_failed(index, self.plan.host_of(index), exit_code)
            return exit_code
        self._say_mpirun_report(code)
        return code

    def _say_failed(self, index: int, host: str, exit_code: int) -> None:
        self.say(f"instance {index} on {host} failed first with {describe_exit(exit_code)}; "
                 "every instance was stopped")

    def _say_mpirun_report(self, code: int) -> None:
        report = failure_report("\n".join(self._mpirun_said))
        if report is not None and report.exit_code is not None:
            self._say_failed(report.index, self.plan.host_of(report.index), report.exit_code)
        elif report is not None and report.signal is not None:
            self.say(f"instance {report.index} on {report.node} was ended by "
                     f"{describe_signal(report.signal)}; every instance was stopped")
        elif code > 128:
            self.say(f"mpirun was ended by {describe_signal(code - 128)}")
        else:
            self.say(f"mpirun exited with code {code}")

    def _sweep(self, job_id: str, env: dict[str, str]) -> None:
        """Remove the job's shared memory on every host (`shm_sweep`). Hosts given up as
        silent are left out (mpirun would wait for them); their own agents sweep what their
        ranks left when those end."""
        lost = {self.plan.host_of(i) for i in self.silent}
        hosts = [h for h in self.plan.hosts if h not in lost]
        if hosts:
            sweep_hosts(job_id, hosts, self.mpirun, self.plan.global_args, env, self.say)
