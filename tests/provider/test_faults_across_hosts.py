"""Faults across hosts, on hosts that are real hosts (tests/hosts.py: own network, PID and
mount namespaces, own sshd): TPTrainOperator with mp 2 x dp 2 on two hosts, a fault injected
on the second host mid-training, attached and deferred (the trigger run in-process as the
triggerer runs it), ssh and mpirun launchers. Each scenario asserts the failure line the user
sees, its bound (in heartbeat timeouts) and that nothing is left on either host.

Every run appends what it measured to `build/fault-results.jsonl`; `scripts/fault_table.py`
turns those records into the fault table of the docs (the table is not written by hand).

Each scenario runs with both launchers, attached and deferred (`MATRIX`), but two: a task
killed while a host is frozen is an attached task's on_kill, and a host's reboot is a
deferred task's (the triggerer watches while the host is gone). Under mpirun a frozen host's
Open MPI daemon freezes with it; the first host's agent stops what is left there over SSH and
names the host frozen."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from ringflow.train.checkpoint import host_complete_steps
from ringflow_provider.exceptions import RingflowHostUnreachableException
from ringflow_provider.operators.tp_train import TPTrainOperator
from tests.provider.conftest import wait_until
from tests.provider.contexts import TaskInstanceStub
from tests.provider.deferral import first_event, remake
from tests.provider.test_poprun_operator import RecordingLog

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]

HEARTBEAT_S = 6.0
FLAP_HEARTBEAT_S = 10.0   # a 5 s flap must stay shorter than the heartbeat timeout
# under mpirun a lost host costs some fixed seconds beyond the ranks' heartbeat (the agent's
# grace for a silent host, Open MPI's daemon link probes, the stop over SSH): ~4-5 s, a third
# of the bound at 6 s (measured 13.4-16.2 s there); at 8 s the bound keeps its meaning
MPIRUN_HEARTBEAT_S = 8.0


def heartbeat_of(launcher: str) -> float:
    return MPIRUN_HEARTBEAT_S if launcher == "mpirun" else HEARTBEAT_S
FLAP_S = 5.0
RESULTS = Path(__file__).resolve().parents[2] / "build" / "fault-results.jsonl"
MLP = {"input_size": 8, "hidden_size": 256, "num_classes": 4}


@pytest.fixture
def two_hosts(ns_hosts, ns_conns):
    """The first two namespace hosts with their links up; nothing of a job may be left on
    either afterwards."""
    hosts = list(ns_hosts)[:2]
    yield hosts, dict(zip([h.address for h in hosts], ns_conns[:2]))
    for host in hosts:
        host.reappear()
    problems = []
    for host in hosts:
        # an sshd session whose client went away during the partition is the test's own
        # connection, not the job's: only the job's processes count
        try:
            wait_until(lambda host=host: not job_processes(host), 30,
                       f"{host.address}: every process of the job to end")
        except AssertionError as exc:
            problems.append(f"{exc}: {host.leftovers()}")
            # the next test must start on a clean host whatever this one left
            host.sh("kill -CONT {0}; kill -KILL {0}".format(
                " ".join(str(p.pid) for p in job_processes(host)) or "0"))
        left = host.shm_entries()
        if left:
            problems.append(f"{host.address}: shared memory left: {left}")
            host.sh("rm -f " + " ".join(f"/dev/shm/{name}" for name in left))
    assert not problems, problems


def record(scenario: str, launcher: str, mode: str, bound: str, measured_s: float | None,
           seen: str, heartbeat_s: float = HEARTBEAT_S) -> None:
    """One row of the fault table's source (scripts/fault_table.py)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps({"scenario": scenario, "launcher": launcher, "mode": mode,
                            "bound": bound, "measured_s": measured_s, "seen": seen,
                            "heartbeat_s": heartbeat_s,
                            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")


@dataclass
class Watched:
    """A job started in a thread, attached or deferred, with its log lines so far."""

    op: Any
    mode: str
    log: RecordingLog = field(default_factory=RecordingLog)
    outcome: dict = field(default_factory=dict)
    thread: threading.Thread | None = None

    def lines(self) -> list[str]:
        return [m for _, m in self.log.records] + [m for _, m in self.op.log.records]

    def steps(self) -> list[int]:
        return [int(m.split()[1].split("/")[0]) for m in self.lines() if m.startswith("step ")]

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        wait_until(lambda: any(s >= step for s in self.steps()) or not self.thread.is_alive(),
                   timeout, f"training to pass step {step}")
        assert self.thread.is_alive(), (self.outcome, self.lines()[-30:])

    def end(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def start(two_hosts, launcher: str, mode: str, heartbeat: float, run_id: str | None = None,
          try_number: int = 1, **overrides) -> Watched:
    hosts, conns = two_hosts
    run_id = run_id or f"run-{uuid.uuid4().hex[:8]}"
    args = dict(task_id="train", hosts=[h.address for h in hosts], ssh_conn_id=conns,
                python="/usr/bin/python3", model="mlp", model_args=MLP, dtype="float32",
                steps=100000, log_every=1, global_batch_size=256, seed=3,
                tensor_parallel_degree=2, nproc_per_host=2, checkpoint_every=5,
                optimizer={"type": "adam", "learning_rate": 0.01}, launcher=launcher,
                heartbeat_timeout=heartbeat, deferrable=mode == "deferred", poll_interval=0.5)
    args.update(overrides)

    def make() -> TPTrainOperator:
        op = TPTrainOperator(**args)
        op._cached_logger = RecordingLog()
        return op

    watched = Watched(make(), mode)
    context = {"ti": TaskInstanceStub("faults", "train", run_id, try_number, 0)}

    def attached() -> None:
        try:
            watched.outcome["result"] = watched.op.execute(context)
        except BaseException as exc:
            watched.outcome["error"] = exc

    def deferred() -> None:
        try:
            watched.op.execute(context)
            raise AssertionError("the task did not defer")
        except TaskDeferred as deferral:
            trigger = remake(deferral.trigger)
            trigger._log = watched.log
            try:
                event = asyncio.run(first_event(trigger, 300))
                watched.outcome["event"] = event.payload
                watched.outcome["result"] = getattr(make(), deferral.method_name)(
                    context, event.payload)
            except BaseException as exc:
                watched.outcome["error"] = exc
        except BaseException as exc:
            watched.outcome["error"] = exc

    watched.thread = threading.Thread(target=attached if mode == "attached" else deferred,
                                      daemon=True)
    watched.thread.start()
    return watched


def lost_line(lost: str, survivor: str, subject: str) -> re.Pattern:
    return re.compile(rf"training failed: {subject} \(ranks 2, 3\) after step \d+: .*; "
                      rf"rank [01] on host {re.escape(survivor)} noticed first: .*"
                      rf"no heartbeat from rank [23] on {re.escape(lost)}", re.S)


MATRIX = [("ssh", "attached"), ("ssh", "deferred"), ("mpirun", "attached"),
          ("mpirun", "deferred")]


@pytest.mark.parametrize("launcher,mode", MATRIX)
def test_a_partitioned_host_is_named_and_stops_its_own_ranks(two_hosts, launcher, mode):
    """The second host's link goes down (packets dropped, no FIN or RST): the task fails
    within 2 x the heartbeat timeout naming that host as lost, the cut-off host's ranks stop
    by themselves within 3 x the heartbeat timeout (nobody can reach them), and once the
    link is back nothing is left on either host."""
    hosts, heartbeat = two_hosts[0], heartbeat_of(launcher)
    first, second = hosts[0].address, hosts[1].address
    watched = start(two_hosts, launcher, mode, heartbeat)
    watched.wait_for_step(5)
    hosts[1].vanish()
    cut = time.monotonic()
    assert watched.end(4 * heartbeat + 30), ("the task did not end", watched.lines()[-20:])
    failed_after = time.monotonic() - cut
    error = watched.outcome.get("error")
    assert isinstance(error, RingflowHostUnreachableException), (watched.outcome,
                                                                 watched.lines()[-30:])
    message = str(error)
    assert lost_line(second, first, f"lost contact with host {re.escape(second)}").match(
        message), message
    # the cut-off host's ranks noticed the silence too and ended by themselves
    wait_until(lambda: not [p for p in hosts[1].leftovers() if "ringflow.train" in p.cmdline],
               3 * heartbeat + 10 - (time.monotonic() - cut),
               f"{second}: its ranks to stop while it is cut off")
    stopped_after = time.monotonic() - cut
    record("partition of one host", launcher, mode, "fails within 2 x heartbeat; its ranks "
           "stop within 3 x heartbeat", round(failed_after, 1), message.split(":")[0]
           + ": " + message.split(": ", 1)[1].split(";")[0], heartbeat)
    assert failed_after <= 2 * heartbeat + 3, f"failed {failed_after:.1f} s after the cut"
    assert stopped_after <= 3 * heartbeat + 3, f"ranks stopped {stopped_after:.1f} s after"


# what marks the launcher's short commands on a host (following the output, a peek, a lease
# renewal), as against the job's own processes
_WATCHER_MARKS = (" follow ", "peek", '"$d/lease"', '"$d/.lease.tmp"')


def job_processes(host, watchers: bool = True) -> list:
    """The job's processes on a host: its supervisor, agent, ranks, Open MPI's daemon and
    (with `watchers`) the launcher's watch commands (following, peeks, lease renewals); not
    sshd's sessions."""
    return [p for p in host.leftovers() if not p.cmdline.startswith("sshd:")
            and (watchers or not any(mark in f" {p.cmdline} " for mark in _WATCHER_MARKS))]


@pytest.mark.parametrize("launcher,mode", [("ssh", "attached"), ("ssh", "deferred")])
def test_a_frozen_host_is_named_frozen(two_hosts, launcher, mode):
    """Every process of the job on the second host SIGSTOPped (a host that hangs while its
    sshd still answers): the task fails within 2 x the heartbeat timeout naming the host as
    frozen; the stop continues its processes so that they end; nothing is left."""
    hosts = two_hosts[0]
    first, second = hosts[0].address, hosts[1].address
    watched = start(two_hosts, launcher, mode, HEARTBEAT_S)
    watched.wait_for_step(5)
    frozen = job_processes(hosts[1], watchers=False)
    assert any("ringflow.train" in p.cmdline for p in frozen), frozen
    hosts[1].run(["kill", "-STOP", *(str(p.pid) for p in frozen)])
    cut = time.monotonic()
    assert watched.end(4 * HEARTBEAT_S + 30), ("the task did not end", watched.lines()[-40:])
    failed_after = time.monotonic() - cut
    message = str(watched.outcome.get("error"))
    record("a frozen host (its job's processes stopped)", launcher, mode,
           "fails within 2 x heartbeat", round(failed_after, 1),
           message.split(";")[0])
    assert lost_line(second, first, f"host {re.escape(second)} froze").match(message), \
        (message, watched.lines()[-30:])
    assert failed_after <= 2 * HEARTBEAT_S + 3, f"failed {failed_after:.1f} s after freezing"


@pytest.mark.parametrize("mode", ["attached", "deferred"])
def test_a_frozen_host_under_mpirun_leaves_nothing_of_the_job(two_hosts, mode):
    """launcher="mpirun", every process of the job on the second host SIGSTOPped, Open MPI's
    daemon with them: mpirun gives the host up and the first host's agent continues and
    stops, over SSH, what ran there (its stop finds them frozen: the host is named frozen
    within 2 x the heartbeat timeout), so no frozen process of the job stays on that host
    once the task has failed."""
    hosts = two_hosts[0]
    first, second = hosts[0].address, hosts[1].address
    watched = start(two_hosts, "mpirun", mode, MPIRUN_HEARTBEAT_S)
    watched.wait_for_step(5)
    frozen = job_processes(hosts[1], watchers=False)
    assert any("ringflow.train" in p.cmdline for p in frozen), frozen
    assert any("orted" in p.cmdline for p in frozen), frozen
    hosts[1].run(["kill", "-STOP", *(str(p.pid) for p in frozen)])
    cut = time.monotonic()
    assert watched.end(4 * MPIRUN_HEARTBEAT_S + 30), ("the task did not end", watched.lines()[-40:])
    failed_after = time.monotonic() - cut
    message = str(watched.outcome.get("error"))
    assert lost_line(second, first, f"host {re.escape(second)} froze").match(message), \
        (message, watched.lines()[-30:])
    # the stop ran before the task failed: what is left ends within moments, not never
    wait_until(lambda: not job_processes(hosts[1], watchers=False), 5,
               f"{second}: the frozen processes of the job to end")
    assert any(re.search(rf"{re.escape(second)} \(given up\): stopped \d+ process\(es\) of "
                         r"the job; \d+ of them were frozen \(stopped by SIGSTOP\)", line)
               for line in watched.lines()), watched.lines()[-30:]
    record("a frozen host (its job's processes stopped)", "mpirun", mode,
           "fails within 2 x heartbeat; nothing of the job left on the host",
           round(failed_after, 1), message.split(";")[0], MPIRUN_HEARTBEAT_S)
    assert failed_after <= 2 * MPIRUN_HEARTBEAT_S + 3, f"failed {failed_after:.1f} s after freezing"


def test_a_task_killed_while_a_host_is_frozen_under_mpirun_leaves_nothing_there(two_hosts):
    """launcher="mpirun", the second host's job frozen (Open MPI's daemon with it), then the
    task is killed (on_kill): mpirun cannot stop what runs there; once the stop's grace has
    passed the first host's agent stops it over SSH, and nothing of the job stays frozen on
    the host."""
    hosts = two_hosts[0]
    second = hosts[1].address
    watched = start(two_hosts, "mpirun", "attached", 60.0)  # no heartbeat timeout meanwhile
    watched.wait_for_step(5)
    frozen = job_processes(hosts[1], watchers=False)
    assert any("orted" in p.cmdline for p in frozen), frozen
    hosts[1].run(["kill", "-STOP", *(str(p.pid) for p in frozen)])
    killed = time.monotonic()
    watched.op.on_kill()
    assert watched.end(60), ("the task did not end", watched.lines()[-40:])
    wait_until(lambda: not job_processes(hosts[1], watchers=False), 10,
               f"{second}: the frozen processes of the job to end")
    ended_after = time.monotonic() - killed
    assert any(re.search(rf"{re.escape(second)} \(after the stop\): stopped \d+ process\(es\) "
                         r"of the job; \d+ of them were frozen", line)
               for line in watched.lines()), watched.lines()[-30:]
    record("the task killed while a host is frozen", "mpirun", "attached",
           "nothing of the job left on the host", round(ended_after, 1),
           str(watched.outcome.get("error")).splitlines()[0][:200], 60.0)


@pytest.mark.parametrize("launcher,mode", MATRIX)
def test_a_link_flap_shorter_than_the_heartbeat_timeout_loses_no_step(two_hosts, launcher,
                                                                        mode):
    """The second host's link down for 5 s (a switch reboot, a flapping port) and back: the
    job goes on and succeeds, every step logged once, none lost or repeated."""
    hosts = two_hosts[0]
    watched = start(two_hosts, launcher, mode, FLAP_HEARTBEAT_S, steps=400,
                    checkpoint_every=50)
    watched.wait_for_step(5)
    hosts[1].vanish()
    time.sleep(FLAP_S)
    hosts[1].reappear()
    assert watched.end(300), "the job did not end"
    summary = watched.outcome.get("result")
    assert summary is not None, (watched.outcome, watched.lines()[-30:])
    assert summary["steps"] == 400 and summary["resumed_from"] is None
    assert [s for s, _ in summary["loss_history"]] == list(range(1, 401))
    assert watched.steps() == list(range(1, 401))  # each progress line once, in order
    record("a link flap shorter than the heartbeat timeout (5 s)", launcher, mode,
           "the job goes on; no step lost or repeated", None, "the task succeeds",
           FLAP_HEARTBEAT_S)


def ranks_on(host) -> list:
    """The ranks of the job on a host (not its supervisor or agent, whose arguments name
    the training module too)."""
    return [p for p in host.leftovers() if " -m ringflow.train " in p.cmdline
            and "ringflow.launch" not in p.cmdline]


@pytest.mark.parametrize("launcher,mode", MATRIX)
def test_clock_skew_does_not_change_which_failure_is_named_first(two_hosts, launcher, mode):
    """The second host's clock 30 s behind (its ringflow processes add the test-only
    RINGFLOW_TEST_CLOCK_SKEW_S to every time they report; the namespace hosts share one
    kernel clock, and libfaketime is not installed here): a rank on the first host is
    killed, 0.3 s later one on the second host (its ranks held stopped meanwhile, so they
    cannot notice the first). By the second host's own clock its rank died 29.7 s earlier;
    the launcher puts each host's times on its own clock (read when it started the job) and
    names the rank that really failed first."""
    hosts = two_hosts[0]
    first, second = hosts[0].address, hosts[1].address
    site = hosts[1].home / ".local/lib/python3.11/site-packages"
    site.mkdir(parents=True, exist_ok=True)
    skew = site / "ringflow_test_clock_skew.pth"
    # every python on that host (its supervisor, agent, ranks and the launcher's clock
    # reading) reads its user site
    skew.write_text('import os; os.environ["RINGFLOW_TEST_CLOCK_SKEW_S"] = "-30"\n')
    try:
        watched = start(two_hosts, launcher, mode, heartbeat_of(launcher))
        watched.wait_for_step(5)
        assert any(f"{second} +30." in line for line in watched.lines()), \
            [line for line in watched.lines() if "clock" in line]
        mine, theirs = (ranks_on(host) for host in hosts)
        assert len(mine) == len(theirs) == 2, (mine, theirs)
        hosts[1].run(["kill", "-STOP", *(str(p.pid) for p in theirs)])
        hosts[0].run(["kill", "-KILL", str(mine[0].pid)])
        time.sleep(0.3)
        hosts[1].run(["kill", "-KILL", str(theirs[0].pid)])
        hosts[1].run(["kill", "-CONT", str(theirs[1].pid)])
        assert watched.end(60), ("the task did not end", watched.lines()[-20:])
    finally:
        skew.unlink()
    message = str(watched.outcome.get("error"))
    named = message.split(";")[0]
    record("clock skew of 30 s on one host (a rank killed on each, 0.3 s apart)", launcher,
           mode, "the rank that failed first is named", None,
           re.sub(r" \(pid \d+\)", "", named.split(" (128+")[0]))
    assert re.match(rf"training failed: rank [01] on host {re.escape(first)} \(pid "
                    rf"{mine[0].pid}\) failed first with exit code 137", named), message


# why a rebooted host is lost: its supervisor (ssh launcher) or its Open MPI daemon (mpirun)
# went with it; mpirun ends the job at once then, so whether a rank noticed first is a race
REBOOT_CAUSE = {
    "ssh": r"its supervisor vanished \(the host rebooted, or it was killed\); rank [01] on "
           r"host {first} noticed first",
    "mpirun": r"mpirun lost its Open MPI daemon there \(the host rebooted or went down, or "
              r"the daemon was killed\); (rank [01] on host {first} noticed first|last \d+ "
              r"lines of the launch host's output)"}


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_a_host_that_reboots_during_a_deferred_job(ns_hosts, two_hosts, launcher):
    """The second host loses power and boots again (its PID, mount and IPC namespaces killed
    and made again; its home, the disk, kept) while the triggerer watches the job: the task
    names the host, the job is stopped on the first host, and the retry resumes from the
    newest checkpoint complete on every host."""
    hosts = two_hosts[0]
    first, second = hosts[0].address, hosts[1].address
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    job = dict(steps=2000, checkpoint_every=50)
    heartbeat = heartbeat_of(launcher)
    watched = start(two_hosts, launcher, "deferred", heartbeat, run_id=run_id, **job)
    watched.wait_for_step(120)
    ns_hosts.reboot(hosts[1])
    rebooted = time.monotonic()
    assert watched.end(4 * heartbeat + 30), ("the task did not end", watched.lines()[-20:])
    failed_after = time.monotonic() - rebooted
    message = str(watched.outcome.get("error"))
    assert re.match(rf"training failed: lost contact with host {re.escape(second)} \(ranks 2, "
                    rf"3\) after step \d+: "
                    + REBOOT_CAUSE[launcher].format(first=re.escape(first)), message), \
        (message, watched.lines()[-30:])
    wait_until(lambda: not job_processes(hosts[0]), 10, f"{first}: the job to stop")
    record("a host reboots during a deferred job", launcher, "deferred",
           "the task names the host; a retry resumes", round(failed_after, 1),
           message.split(";")[0])
    folder = f".ringflow/checkpoints/faults/{run_id}/train"
    complete = [{c.step for c in host_complete_steps(str(h.home / folder), i)}
                for i, h in enumerate(hosts)]
    newest = max(complete[0] & complete[1])
    assert newest >= 100, complete
    retry = start(two_hosts, launcher, "attached", heartbeat, run_id=run_id, try_number=2,
                  **job)
    assert retry.end(240), ("the retry did not end", retry.lines()[-20:])
    summary = retry.outcome.get("result")
    assert summary is not None, (retry.outcome, retry.lines()[-30:])
    assert summary["resumed_from"] == newest, (summary["resumed_from"], complete)
    assert summary["loss_history"][0][0] == newest + 1 and summary["steps"] == 2000


def machine_pids(host, processes) -> list[int]:
    """The machine's pids of some of a host's processes (given by their pid in the host)."""
    wanted, found = {p.pid for p in processes}, []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "ns/pid") != host.pid_ns:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines()
                      if line.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) in wanted:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("launcher,mode", MATRIX)
def test_a_straggler_is_named_with_its_step_times_and_no_false_failure(two_hosts, launcher,
                                                                       mode):
    """The second host's ranks slowed to about a third of their speed (SIGSTOP 20 ms, SIGCONT
    10 ms, over and over: the machine has no cgroup v2 hierarchy mounted, so no cpu.max to
    set): the job succeeds, a warning names the slow host and how many times slower its
    steps are (each rank's own work: its step less the time it waited in the all-reduce),
    and the summary XCom carries each host's step times."""
    hosts = two_hosts[0]
    first, second = hosts[0].address, hosts[1].address
    watched = start(two_hosts, launcher, mode, FLAP_HEARTBEAT_S, steps=240,
                    checkpoint_every=120)
    # slowed from their start, not from a step the task log shows: a deferred task's lines
    # come a poll apart, and 240 steps of this model take well under a second
    wait_until(lambda: len(ranks_on(hosts[1])) == 2 or not watched.thread.is_alive(), 120,
               "the second host's ranks to start")
    slow = machine_pids(hosts[1], ranks_on(hosts[1]))
    assert len(slow) == 2, (slow, watched.outcome, watched.lines()[-20:])
    done = threading.Event()

    def duty_cycle() -> None:
        while not done.is_set():
            for sig, pause in ((signal.SIGSTOP, 0.02), (signal.SIGCONT, 0.01)):
                for pid in slow:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        return
                time.sleep(pause)

    cycler = threading.Thread(target=duty_cycle, daemon=True)
    cycler.start()
    try:
        assert watched.end(240), ("the job did not end", watched.lines()[-20:])
    finally:
        done.set()
        cycler.join(5)
        for pid in slow:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    summary = watched.outcome.get("result")
    assert summary is not None, (watched.outcome, watched.lines()[-30:])
    assert [s for s, _ in summary["loss_history"]] == list(range(1, 241))
    warnings = [line for line in watched.lines() if line.startswith("straggler: ")]
    assert warnings, [line for line in watched.lines() if "host step times" in line][-5:]
    said = re.match(rf"straggler: host {re.escape(second)} is (\d+\.\d) x slower than the "
                    rf"other hosts, steps \d+-\d+: its ranks' own work takes [\d.]+ s per "
                    rf"step, theirs [\d.]+ s, and they wait [\d.]+ s per step for it in the "
                    rf"all-reduce", warnings[0])
    assert said and float(said[1]) >= 1.5, warnings
    assert all(second in line and first not in line for line in warnings), warnings
    steps = summary["host_step_s"]
    assert set(steps) == {first, second} and set(summary["host_wait_s"]) == {first, second}
    assert steps[second] > steps[first] > 0, steps
    record("a straggler (one host's ranks slowed to a third)", launcher, mode,
           "no false failure; a warning names the host and how much slower", None,
           warnings[0].split(",")[0])


def watch_sessions(host) -> list[int]:
    """sshd's sessions on a host that serve the launcher (its follow commands or the
    triggerer's connection), by pid in the host's namespace."""
    sessions = [p for p in host.leftovers() if p.cmdline.startswith("sshd:")]
    return [p.pid for p in sessions]


@pytest.mark.parametrize("launcher,mode", MATRIX)
def test_the_airflow_side_losing_its_connection_to_one_host(two_hosts, launcher, mode):
    """Every SSH session of the Airflow side to a host is killed while the job is healthy
    (an sshd restart, a NAT timeout): the second host's with the ssh launcher, the first's
    (the launch host, the only one the Airflow side watches) under mpirun. Attached, the
    watch of that part is lost, so the job is stopped on every host and the task names the
    host; deferred, the trigger reconnects within its budget and the job goes on to
    succeed."""
    hosts = two_hosts[0]
    cut_off = hosts[1] if launcher == "ssh" else hosts[0]
    watched = start(two_hosts, launcher, mode, FLAP_HEARTBEAT_S, steps=300,
                    checkpoint_every=50)
    watched.wait_for_step(5)
    sessions = watch_sessions(cut_off)
    assert sessions, cut_off.leftovers()
    cut = time.monotonic()
    cut_off.run(["kill", "-KILL", *map(str, sessions)])
    assert watched.end(120), ("the task did not end", watched.lines()[-20:])
    ended_after = time.monotonic() - cut
    if mode == "attached":
        message = str(watched.outcome.get("error"))
        # whether a rank noticed its silent peers first or the launcher stopped them first
        assert message.startswith(
            f"training failed: lost contact with host {cut_off.address}"), message
        record("the Airflow side loses its SSH connection to one host", launcher, mode,
               "the job is stopped on every host; the task names the host",
               round(ended_after, 1), message.split(";")[0])
    else:
        summary = watched.outcome.get("result")
        assert summary is not None, (watched.outcome, watched.lines()[-20:])
        assert [s for s, _ in summary["loss_history"]] == list(range(1, 301))
        record("the Airflow side loses its SSH connection to one host", launcher, mode,
               "the trigger reconnects; the job goes on", None, "the task succeeds",
               FLAP_HEARTBEAT_S)
