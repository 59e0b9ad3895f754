"""PopRunOperator(poprun="ringflow-poprun") end to end on hosts that are real hosts (issue 11;
tests/hosts.py): the runtime shipped to both hosts, the seed's poprun command line run by
`python -m ringflow.poprun` on the first host, Open MPI's mpirun starting 2 instances on each
host over SSH between the hosts, and a ringflow data-parallel script
(examples/poprun_dp_train.py) that reads the PADDLE_* env exactly as the seed composes it
(one endpoint per host: port + rank in node) training across the hosts, with the losses of
one process. A failing instance on the second host and on_kill leave nothing on any host.

One `ssh` connection reaches both hosts (the operator replaces its host): it pins no host
key, so the hosts' keys come from the worker's known_hosts, here a HOME made for the test.
``execute()`` runs in-process with a minimal context, as test_poprun_operator.py does."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException

from ringflow_provider.operators.poprun import PopRunOperator
from tests.provider.conftest import REPO, hosts_connection, wait_until
from tests.provider.contexts import TaskInstanceStub
from tests.provider.deferral import execute_deferred
from tests.provider.test_poprun_operator import RecordingLog

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]
SCRIPT = REPO / "examples" / "poprun_dp_train.py"
ON_HOST = "/root/poprun_dp_train.py"  # each host's own copy, in its own home
CONN_ID = "ringflow_ns_poprun"
_STEP = re.compile(r"^\[1,0\]<stdout>:step (\d+) loss (\S+)$")
_RANK = re.compile(r"^\[1,(\d)\]<stdout>:rank (\d) of 4 at (\S+)$")


@pytest.fixture
def two_hosts(ns_hosts, monkeypatch, tmp_path):
    """The first two namespace hosts behind one connection id, the script in each host's
    home; afterwards no process and no shm segment of the job on either host."""
    hosts = list(ns_hosts)[:2]
    hosts_connection(monkeypatch, tmp_path / "worker-home", hosts, CONN_ID)
    for host in hosts:
        (host.home / Path(ON_HOST).name).write_text(SCRIPT.read_text())
    yield [h.address for h in hosts]
    for host in hosts:
        wait_until(lambda host=host: not host.leftovers(), 15,
                   f"{host.address}: every process of the job to end")
        assert host.shm_entries() == []


def make(hosts: list[str], *script_args: str) -> PopRunOperator:
    op = PopRunOperator(
        task_id="poprun", hosts=hosts, nproc_per_host=2, ipus_per_replica=1, num_ipus=4,
        ipu_partition="pod4", vipu_server="127.0.0.1", training_script=ON_HOST,
        training_script_args=list(script_args), python="/usr/bin/python3",
        poprun="ringflow-poprun", ssh_conn_id=CONN_ID, ringflow_job=True)
    op._cached_logger = RecordingLog()
    return op


def ctx() -> dict:
    return {"ti": TaskInstanceStub("cpu_poprun", "poprun")}


def lines(op) -> list[str]:
    return [message for _, message in op.log.records]


def serial_losses(tmp_path: Path, steps: int) -> dict[int, float]:
    """The script alone, one process on the whole batch (no PADDLE_* env: world of one)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(steps)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = (re.match(r"^step (\d+) loss (\S+)$", line) for line in out.stdout.splitlines())
    return {int(m.group(1)): float(m.group(2)) for m in found if m}


def test_a_poprun_dag_trains_across_two_cpu_hosts_with_one_process_losses(two_hosts,
                                                                        tmp_path):
    a, b = two_hosts
    op = make(two_hosts, "--steps", "10")
    summary = op.execute(ctx())
    assert summary["exit_code"] == 0 and summary["num_instances"] == 4
    job_id, = re.findall(r"-x RINGFLOW_JOB_ID=(\w+)", " ".join(summary["argv"]))
    # ringflow-poprun runs the operator's job (its id, its token), not one of its own
    assert any(f"; job {job_id}; " in m for m in lines(op))
    assert not any("warning" in m for m in lines(op))
    assert summary["argv"][0] == "ringflow-poprun"
    log = lines(op)
    assert sum("runtime uploaded at" in m or "runtime reused at" in m for m in log) == 2
    assert f"ringflow-poprun: 4 instance(s) on 2 host(s) ({a},{b}, 2 each), 4 replica(s)" \
        in "\n".join(log)
    # one endpoint per host in PADDLE_TRAINER_ENDPOINTS; each rank listens on port + rank in
    # node of its host (instances in contiguous blocks)
    ranks = {int(m.group(1)): (int(m.group(2)), m.group(3))
             for m in map(_RANK.match, log) if m}
    assert ranks == {0: (0, f"{a}:8090"), 1: (1, f"{a}:8091"), 2: (2, f"{b}:8090"),
                     3: (3, f"{b}:8091")}
    losses = {int(m.group(1)): float(m.group(2)) for m in map(_STEP.match, log) if m}
    expected = serial_losses(tmp_path, 10)
    assert sorted(losses) == list(range(10)) == sorted(expected)
    for step, value in expected.items():
        assert losses[step] == pytest.approx(value, abs=1e-10, rel=0)


def test_an_instance_failing_on_the_second_host_fails_the_task_naming_it(two_hosts):
    _, b = two_hosts
    op = make(two_hosts, "--steps", "50", "--fail-rank", "3", "--fail-step", "2")
    with pytest.raises(AirflowException, match="with exit code 3") as failure:
        op.execute(ctx())
    named = (f"ringflow-poprun: instance 3 on {b} failed first with exit code 3; every "
             "instance was stopped")
    assert named in str(failure.value) and named in lines(op)
    assert "[1,3]<stdout>:rank 3: failing at step 2 as asked" in lines(op)


def test_on_kill_stops_every_instance_on_every_host(two_hosts):
    op = make(two_hosts, "--steps", "1000000")
    outcome: dict = {}

    def target():
        try:
            outcome["result"] = op.execute(ctx())
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_until(lambda: any(m.startswith("[1,0]<stdout>:step 20 ") for m in lines(op)), 120,
               "training to pass step 20")
    started = time.monotonic()
    op.on_kill()
    assert time.monotonic() - started < 2.5
    thread.join(30)
    assert "was killed (on_kill)" in str(outcome.get("error"))


def test_a_deferred_poprun_job_on_cpu_hosts_reports_as_an_attached_one(two_hosts):
    """ringflow-poprun under the launch host's supervisor, watched by the trigger over
    asyncssh: the instances' lines reach its log and the task's summary is the same."""
    trigger_log = RecordingLog()
    op = make(two_hosts, "--steps", "10")
    op.deferrable, op.poll_interval = True, 0.5
    summary, _ = execute_deferred(op, ctx(), lambda: make(two_hosts, "--steps", "10"),
                                   log=trigger_log)
    assert summary["exit_code"] == 0 and summary["num_instances"] == 4
    shown = [m for _, m in trigger_log.records]
    steps = sorted({int(m.group(1)) for m in map(_STEP.match, shown) if m})
    assert steps == list(range(10))
    assert any(m.startswith("ringflow-poprun: 4 instance(s) on 2 host(s)") for m in shown)
