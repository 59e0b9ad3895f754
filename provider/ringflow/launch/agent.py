"""The launcher agent: spawn this host's ranks, watch them, stop them all on the first failure
or on a signal, clean up (processes, shm segments), and report one all-or-nothing result.

Each worker is the leader of its own session and process group (pgid == pid), watched
without being reaped until the very end (`ringflow.launch.workers`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ringflow.errors import LaunchError
from ringflow.launch.config import LaunchConfig
from ringflow.launch.env import JOB_ID_VAR, JobIdentity, plan_endpoints, worker_env
from ringflow.launch.exits import (
    STDIN_CLOSED_EXIT,
    end_of_blame,
    failure_order,
    host_time,
    signal_name,
)
from ringflow.launch.logs import Console, LogPump, tail_lines
from ringflow.launch.processes import (
    Prctl,
    children_of,
    describe_returncode,
    live_groups,
    reap_orphans,
    signal_group,
    terminate_group,
)
from ringflow.launch.result import JobResult, RankResult
from ringflow.launch.shm import sweep_job_segments
from ringflow.launch.stdin import StdinWatch
from ringflow.launch.watchdog import WatchdogClient
from ringflow.launch.workers import ExitWaiter, SignalTrap, Worker, open_pidfd

POLL_S = 0.05
ORPHAN_SWEEP_S = 2.0
KILL_WAIT_S = 5.0  # after SIGKILL: only a process stuck in the kernel takes longer
PUMP_JOIN_S = 5.0
TAIL_LINES = 20
# after the first failure seen, how long an earlier one has to show (see _root_cause)
ROOT_CAUSE_GRACE_S = 0.5
EXITING_WAIT_S = 5.0  # ... and for a rank that reported it began to exit to end
PUMP_REPORT_S = 0.2


@dataclass(frozen=True)
class Cause:
    """Why the job ended: the root cause the launcher reports and exits with."""

    status: str  # succeeded | failed | stopped
    exit_code: int
    text: str
    worker: Worker | None = None


class Agent:
    """One launcher agent for one host of one job."""

    def __init__(self, config: LaunchConfig, identity: JobIdentity, console: Console,
                 environ: Mapping[str, str] | None = None,
                 lifeline: StdinWatch | None = None) -> None:
        self.config = config
        self.identity = identity
        self.console = console
        self.environ = dict(os.environ if environ is None else environ)
        self.lifeline = lifeline  # --stdin: its end stops the job
        self.workers: list[Worker] = []
        self._prctl = Prctl()
        self._watchdog: WatchdogClient | None = None

    def run(self) -> JobResult:
        started = time.monotonic()
        trap = SignalTrap()
        trap.install()
        self._prctl.become_subreaper()
        cause = Cause("failed", 1, "the launcher did not get to watch the job")
        try:
            self._watchdog = WatchdogClient(self.identity.job_id, self.config.grace_s)
            self._start(trap)
            if self.lifeline is not None:
                self.lifeline.start()
            cause = self._watch(trap)
        except LaunchError as exc:
            cause = Cause("failed", 1, str(exc))
            self.console.info(f"error: {exc}")
        finally:
            leftovers = self._stop_all(trap)
            self._join_pumps()
            removed = sweep_job_segments(self.identity.job_id)
            if self._watchdog is not None:
                self._watchdog.release()
            trap.restore()
        return self._report(cause, time.monotonic() - started, removed, leftovers)

    # -- start ---------------------------------------------------------------------------

    def _start(self, trap: SignalTrap) -> None:
        endpoints = plan_endpoints(self.config)
        log_dir = self.config.log_dir
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaunchError(f"cannot create --log-dir {log_dir}: {exc}") from exc
        for local_rank in range(self.config.nproc_per_host):
            if trap.received:
                return  # the watch loop reports the signal
            self._spawn(local_rank, endpoints)
        # pumps are threads, and forking (preexec_fn) is only safe before any thread exists
        for w in self.workers:
            try:
                w.pump = LogPump(w.rank, w.proc.stdout, w.log_path, self.console)
            except OSError as exc:
                raise LaunchError(f"cannot open {w.log_path} for rank {w.rank}: {exc}") from exc
            w.pump.start()
        ranks = [w.rank for w in self.workers]
        self.console.info(
            f"job {self.identity.job_id}: host {self.config.host} "
            f"({self.config.host_index + 1} of {self.config.nnodes}) runs ranks "
            f"{ranks[0]}..{ranks[-1]} of {self.config.world_size}, pids "
            f"{','.join(str(w.proc.pid) for w in self.workers)}, logs {log_dir}/workerlog.N")

    def _spawn(self, local_rank: int, endpoints: list[str]) -> None:
        rank = self.config.global_rank(local_rank)
        env = worker_env(self.config, self.identity, endpoints, local_rank, self.environ)
        argv = self.config.command(sys.executable)
        try:
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=self._prctl.child_setup(os.getpid()),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise LaunchError(f"cannot start rank {rank} (local rank {local_rank}) on host "
                              f"{self.config.host}: {argv[0]}: {exc}") from exc
        log_path = self.config.log_dir / f"workerlog.{rank}"
        self.workers.append(Worker(local_rank, rank, proc, log_path, pidfd=open_pidfd(proc.pid)))
        assert self._watchdog is not None
        self._watchdog.watch_group(proc.pid)

    # -- watch ---------------------------------------------------------------------------

    def _watch(self, trap: SignalTrap) -> Cause:
        waiter = ExitWaiter(self.workers)
        last_sweep = time.monotonic()
        while True:
            if trap.received:
                return self._signal_cause(trap.received[0])
            for w in waiter.ended(POLL_S):
                if w.returncode != 0:
                    return self._failure_cause(self._root_cause(waiter))
            if all(w.returncode is not None for w in self.workers):
                return Cause("succeeded", 0, f"all {len(self.workers)} ranks exited 0")
            if self.lifeline is not None and self.lifeline.ended.is_set():
                return self._stdin_cause(self.lifeline.reason)
            if time.monotonic() - last_sweep > ORPHAN_SWEEP_S:
                reap_orphans(self._own_pids())
                last_sweep = time.monotonic()

    def _root_cause(self, waiter: ExitWaiter) -> Worker:
        """The failed rank that began to exit first. The first exit seen need not be it: a
        rank that raised closes its rings on its way out, and a peer that sees them close
        can end before it does. So wait a moment for more exits and for the reports, and for
        the ranks that said they are exiting to end; then `failure_order` (a killed rank's
        time is when its exit was seen, which lags its death by the wake-up of this
        launcher, while a peer that notices the death may report its own exit sooner),
        then along who blamed whom (`end_of_blame`): a rank that failed because another
        rank here failed is not the cause, whichever began to exit first."""
        start = time.monotonic()
        while True:
            running = [w for w in self.workers if w.returncode is None]
            exiting = [w for w in running if w.pump is not None and w.pump.began_exit_at]
            waited = time.monotonic() - start
            if not running or waited >= EXITING_WAIT_S or (
                    waited >= ROOT_CAUSE_GRACE_S and not exiting):
                break
            waiter.ended(POLL_S)
        failed = [w for w in self.workers if w.returncode not in (None, 0)]
        reports_by = time.monotonic() + PUMP_REPORT_S
        for w in failed:  # its report, if any, is in the pipe before its exit
            if w.pump is not None:
                w.pump.join(timeout=max(0.0, reports_by - time.monotonic()))
        first = min(failed, key=lambda w: failure_order(w.after_peer_failure,
                                                          w.began_exit_at, w.rank))
        return end_of_blame(first, {w.rank: w for w in failed},
                            lambda w: w.blamed_rank if w.after_peer_failure else None)

    def _failure_cause(self, w: Worker) -> Cause:
        code, how = describe_returncode(w.returncode)
        text = (f"rank {w.rank} (local rank {w.local_rank}, host {self.config.host}, "
                f"pid {w.proc.pid}) failed first: {how}")
        self.console.info(f"{text}; stopping the other ranks")
        return Cause("failed", code, text, w)

    def _signal_cause(self, signum: int) -> Cause:
        name = signal.Signals(signum).name
        text = f"the launcher received {name}"
        self.console.info(f"{text}; stopping all ranks")
        return Cause("stopped", 128 + signum, text)

    def _stdin_cause(self, reason: str) -> Cause:
        text = f"{reason}: whoever started this launcher with --stdin is gone"
        self.console.info(f"{text}; stopping all ranks")
        return Cause("stopped", STDIN_CLOSED_EXIT, text)

    def _own_pids(self) -> set[int]:
        pids = {w.proc.pid for w in self.workers}
        if self._watchdog is not None:
            pids.add(self._watchdog.proc.pid)
        return pids

    # -- stop ----------------------------------------------------------------------------

    def _stop_all(self, trap: SignalTrap) -> list[int]:
        """SIGTERM every group, SIGKILL after the grace (or at a further signal), then wait
        for every group to empty; returns the groups that would not die."""
        groups = [w.pgid for w in self.workers]
        for w in self.workers:
            w.stopped = not w.check_exit()
            terminate_group(w.pgid)  # also reaches an exited rank's children
        signals_before = len(trap.received)
        deadline = time.monotonic() + self.config.grace_s
        why = f"still running {self.config.grace_s:g} s after SIGTERM"
        while live_groups(groups) and time.monotonic() < deadline:
            if len(trap.received) > signals_before:
                self.console.info("signalled again: killing all ranks now")
                why = "signalled again"
                break
            reap_orphans(self._own_pids())
            time.sleep(POLL_S)
        for w in self.workers:
            if w.pgid in live_groups([w.pgid]):
                self.console.info(f"rank {w.rank} {why}: sending SIGKILL")
                signal_group(w.pgid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while live_groups(groups) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self._kill_escapees()
        return self._collect(groups)

    def _kill_escapees(self) -> None:
        """Descendants that left their rank's group (daemonized) were re-parented to us, the
        subreaper, when their parent died: kill those carrying this job's id."""
        marker = f"{JOB_ID_VAR}={self.identity.job_id}".encode()
        for _ in range(3):  # an escapee's own children are re-parented to us when it dies
            found = [p for p in children_of(os.getpid(), self._own_pids())
                     if marker in _environ_entries(p)]
            for pid in found:
                self.console.info(f"killing pid {pid}: a rank's descendant that left its "
                                  "process group")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(POLL_S if found else 0)
            reap_orphans(self._own_pids())
            if not found:
                return

    def _collect(self, groups: list[int]) -> list[int]:
        leftovers = sorted(live_groups(groups))
        for w in self.workers:
            try:
                w.proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                continue
            if w.returncode is None:
                w.returncode, w.ended_at = w.proc.returncode, round(host_time(), 3)
            if w.pidfd is not None:
                os.close(w.pidfd)
                w.pidfd = None
        reap_orphans(self._own_pids())
        return leftovers

    def _join_pumps(self) -> None:
        deadline = time.monotonic() + PUMP_JOIN_S
        for w in self.workers:
            if w.pump is not None:
                w.pump.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- report --------------------------------------------------------------------------

    def _report(self, cause: Cause, duration_s: float, removed: list[str],
                leftovers: list[int]) -> JobResult:
        if cause.worker is not None:
            path = cause.worker.log_path
            lines = tail_lines(path, TAIL_LINES)
            self.console.info(f"{cause.text}; last {len(lines)} lines of {path}:")
            for line in lines:
                self.console.info(f"  | {line}")
        if removed:
            self.console.info(f"removed {len(removed)} shared-memory segments left behind: "
                              f"{', '.join(removed)}")
        if leftovers:
            self.console.info(f"process groups still alive after SIGKILL: {leftovers}")
        result = JobResult(
            job_id=self.identity.job_id, host=self.config.host,
            host_index=self.config.host_index, nproc_per_host=self.config.nproc_per_host,
            world_size=self.config.world_size, status=cause.status,
            exit_code=cause.exit_code,
            failed_rank=cause.worker.rank if cause.worker is not None else None,
            cause=cause.text, duration_s=round(duration_s, 3), log_dir=str(self.config.log_dir),
            ranks=[_rank_result(w) for w in self.workers], shm_removed=removed,
            leftover_groups=leftovers,
        )
        self.console.info(f"result {result.to_json()}")
        return result


def _rank_result(w: Worker) -> RankResult:
    code: int | None = None
    sig: str | None = None
    if w.returncode is not None:
        code, _ = describe_returncode(w.returncode)
        if w.returncode < 0:
            sig = signal_name(-w.returncode)
    return RankResult(rank=w.rank, local_rank=w.local_rank, pid=w.proc.pid,
                      returncode=w.returncode, exit_code=code, signal=sig,
                      ended_at=w.began_exit_at, after_peer_failure=w.after_peer_failure,
                      stopped_by_launcher=w.stopped, blamed_rank=w.blamed_rank)


def _environ_entries(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []
