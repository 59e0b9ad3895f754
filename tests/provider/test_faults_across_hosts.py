"""Faults across hosts, on hosts that are real hosts (tests/hosts.py: own network, PID and
mount namespaces, own sshd): TPTrainOperator with mp 2 x dp 2 on two hosts, a fault injected
on the second host mid-training, attached and deferred (the trigger run in-process as the
triggerer runs it), ssh and mpirun launchers. Each scenario asserts the failure line the user
sees, its bound (in heartbeat timeouts) and that nothing is left on either host.

Every run appends what it measured to `build/fault-results.jsonl`; `scripts/fault_table.py`
turns those records into the fault table of the docs (the table is not written by hand).

The scenarios are paired rather than the full matrix (launcher x mode x scenario), so the
suite stays within its time budget: the partition, the scenario every other one builds on,
runs in all four combinations, the link flap in two that differ in both. A frozen host is
named as frozen with the ssh launcher (attached and deferred): under mpirun its Open MPI
daemon freezes with it and the host is named as lost."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from ringflow_provider.exceptions import RingflowHostUnreachableException
from ringflow_provider.operators.tp_train import TPTrainOperator
from tests.provider.conftest import wait_until
from tests.provider.contexts import TaskInstanceStub
from tests.provider.deferral import first_event, remake
from tests.provider.test_poprun_operator import RecordingLog

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]

HEARTBEAT_S = 6.0
FLAP_HEARTBEAT_S = 10.0   # a 5 s flap must stay shorter than the heartbeat timeout
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
    for host in hosts:
        # an sshd session whose client went away during the partition is the test's own
        # connection, not the job's: only the job's processes count
        try:
            wait_until(lambda host=host: not job_processes(host), 30,
                       f"{host.address}: every process of the job to end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {host.leftovers()}") from None
        assert host.shm_entries() == []


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


def start(two_hosts, launcher: str, mode: str, heartbeat: float, **overrides) -> Watched:
    hosts, conns = two_hosts
    run_id = f"run-{uuid.uuid4().hex[:8]}"
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
    context = {"ti": TaskInstanceStub("faults", "train", run_id, 1, 0)}

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
    hosts = two_hosts[0]
    first, second = hosts[0].address, hosts[1].address
    watched = start(two_hosts, launcher, mode, HEARTBEAT_S)
    watched.wait_for_step(5)
    hosts[1].vanish()
    cut = time.monotonic()
    assert watched.end(4 * HEARTBEAT_S + 30), ("the task did not end", watched.lines()[-20:])
    failed_after = time.monotonic() - cut
    error = watched.outcome.get("error")
    assert isinstance(error, RingflowHostUnreachableException), (watched.outcome,
                                                                 watched.lines()[-30:])
    message = str(error)
    assert lost_line(second, first, f"lost contact with host {re.escape(second)}").match(
        message), message
    # the cut-off host's ranks noticed the silence too and ended by themselves
    wait_until(lambda: not [p for p in hosts[1].leftovers() if "ringflow.train" in p.cmdline],
               3 * HEARTBEAT_S + 10 - (time.monotonic() - cut),
               f"{second}: its ranks to stop while it is cut off")
    stopped_after = time.monotonic() - cut
    record("partition of one host", launcher, mode, "fails within 2 x heartbeat; its ranks "
           "stop within 3 x heartbeat", round(failed_after, 1), message.split(":")[0]
           + ": " + message.split(": ", 1)[1].split(";")[0])
    assert failed_after <= 2 * HEARTBEAT_S + 3, f"failed {failed_after:.1f} s after the cut"
    assert stopped_after <= 3 * HEARTBEAT_S + 3, f"ranks stopped {stopped_after:.1f} s after"


def job_processes(host, watchers: bool = True) -> list:
    """The job's processes on a host: its supervisor, agent, ranks, Open MPI's daemon and
    (with `watchers`) the launcher's watch commands; not sshd's sessions."""
    return [p for p in host.leftovers() if not p.cmdline.startswith("sshd:")
            and (watchers or (" follow " not in f" {p.cmdline} "
                              and "peek" not in p.cmdline))]


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


@pytest.mark.parametrize("launcher,mode", [("ssh", "attached"), ("mpirun", "deferred")])
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


def watch_sessions(host) -> list[int]:
    """sshd's sessions on a host that serve the launcher (its follow commands or the
    triggerer's connection), by pid in the host's namespace."""
    sessions = [p for p in host.leftovers() if p.cmdline.startswith("sshd:")]
    return [p.pid for p in sessions]


@pytest.mark.parametrize("mode", ["attached", "deferred"])
def test_the_airflow_side_losing_its_connection_to_one_host(two_hosts, mode):
    """Every SSH session of the Airflow side to the second host is killed while the job is
    healthy (an sshd restart, a NAT timeout): attached, the watch of that part is lost, so
    the job is stopped on every host and the task names the host; deferred, the trigger
    reconnects within its budget and the job goes on to succeed."""
    hosts = two_hosts[0]
    second = hosts[1].address
    watched = start(two_hosts, "ssh", mode, FLAP_HEARTBEAT_S, steps=300, checkpoint_every=50)
    watched.wait_for_step(5)
    sessions = watch_sessions(hosts[1])
    assert sessions, hosts[1].leftovers()
    cut = time.monotonic()
    hosts[1].run(["kill", "-KILL", *map(str, sessions)])
    assert watched.end(120), ("the task did not end", watched.lines()[-20:])
    ended_after = time.monotonic() - cut
    if mode == "attached":
        message = str(watched.outcome.get("error"))
        assert second in message.split(";")[0], message
        record("the Airflow side loses its SSH connection to one host", "ssh", mode,
               "the job is stopped on every host; the task names the host",
               round(ended_after, 1), message.split(";")[0])
    else:
        summary = watched.outcome.get("result")
        assert summary is not None, (watched.outcome, watched.lines()[-20:])
        assert [s for s, _ in summary["loss_history"]] == list(range(1, 301))
        record("the Airflow side loses its SSH connection to one host", "ssh", mode,
               "the trigger reconnects; the job goes on", None, "the task succeeds",
               FLAP_HEARTBEAT_S)
