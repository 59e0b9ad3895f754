"""TPTrainOperator with ``hosts`` (issue 11, ``launcher="ssh"``) on hosts that are real
hosts (tests/hosts.py: own network, PID, mount and IPC namespaces, own sshd, Debian's
python3 + numpy): the runtime shipped, one launcher agent per host, mp=2 inside each host
over shared memory and dp=2 across hosts over TCP; the per-step losses equal one process's;
a rank failing on the second host fails the task naming that host; on_kill and a SIGKILLed
task process leave no process and no segment on any host; a retry resumes on every host.

``execute()`` runs in-process with a minimal context, as test_tp_train_operator.py does."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.train.metrics import parse_train_line
from ringflow_provider.exceptions import RingflowFolderException
from ringflow_provider.operators.tp_train import TPTrainOperator
from tests.provider import task_process
from tests.provider.conftest import wait_until
from tests.provider.contexts import TaskInstanceStub
from tests.provider.deferral import execute_deferred, first_event, remake
from tests.provider.job_folders import loosen, not_private
from tests.provider.test_poprun_operator import RecordingLog

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]
MLP = {"input_size": 8, "hidden_size": 16, "num_classes": 4}


@pytest.fixture
def two_hosts(ns_hosts, ns_conns):
    """The first two namespace hosts, their connection ids; nothing of a job may be left on
    any host afterwards (checked inside each host's namespaces)."""
    hosts = [h.address for h in list(ns_hosts)[:2]]
    yield hosts, dict(zip(hosts, ns_conns[:2]))
    for host in list(ns_hosts)[:2]:
        wait_until(lambda host=host: not host.leftovers(), 20,
                   f"{host.address}: every process of the job to end")
        assert host.shm_entries() == []


def ctx(run_id: str, try_number: int = 1, max_tries: int = 0) -> dict:
    return {"ti": TaskInstanceStub("tp_hosts", "train", run_id, try_number, max_tries)}


def make(two_hosts, **overrides):
    hosts, conns = two_hosts
    args = dict(task_id="train", hosts=hosts, ssh_conn_id=conns, python="/usr/bin/python3",
                model="mlp", model_args=MLP, dtype="float64", steps=10, log_every=1,
                global_batch_size=8, seed=3, tensor_parallel_degree=2, nproc_per_host=2,
                optimizer={"type": "adam", "learning_rate": 0.01}, checkpoint_every=5)
    args.update(overrides)
    op = TPTrainOperator(**args)
    op._cached_logger = RecordingLog()
    return op


def log_text(op) -> str:
    return "\n".join(message for _, message in op.log.records)


def serial_losses(tmp_path: Path, **spec) -> dict[int, float]:
    """The same job in one local process (`ringflow train`), its per-step losses."""
    path = tmp_path / "serial.json"
    path.write_text(json.dumps({**spec, "tensor_parallel_degree": 1, "checkpoint_dir": None}))
    out = subprocess.run([str(Path(sys.executable).parent / "ringflow"), "train", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    metrics = [parse_train_line(line) for line in out.stdout.splitlines()]
    return {m[1]["step"]: m[1]["loss"] for m in metrics if m and m[0] == "metric"}


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_two_hosts_train_like_one_process(two_hosts, ns_hosts, tmp_path, launcher):
    """Also: the job's folders are private on every host (0700 folders, 0600 files), the
    state folder tightened from the 0755 it had before."""
    states = [h.home / ".ringflow" / "jobs" for h in list(ns_hosts)[:2]]
    for state in states[:2 if launcher == "ssh" else 1]:  # mpirun: a supervisor on the first
        loosen(state)
    op = make(two_hosts, launcher=launcher)
    summary = op.execute(ctx(f"run-{uuid.uuid4().hex[:8]}"))
    assert [not_private(state) if state.exists() else [] for state in states] == [[], []]
    assert list(states[0].glob("*/try-1/status.json"))  # the first host's job folder
    hosts = two_hosts[0]
    assert (summary["world_size"], summary["mp_degree"], summary["dp_degree"]) == (4, 2, 2)
    assert summary["hosts"] == hosts and summary["steps"] == 10
    losses = dict(summary["loss_history"])
    want = serial_losses(tmp_path, model="mlp", model_args=MLP, dtype="float64", steps=10,
                         log_every=1, global_batch_size=8, seed=3,
                         optimizer={"type": "adam", "learning_rate": 0.01})
    np.testing.assert_allclose([losses[s] for s in range(1, 11)],
                               [want[s] for s in range(1, 11)], rtol=1e-10)
    text = log_text(op)
    assert "runtime uploaded at" in text or "runtime reused at" in text
    for rank in range(4):    # every rank says where it runs, tagged with its host
        assert f"[{hosts[rank // 2]}/rank {rank}] [train] rank {rank} of 4 starts on host " \
            f"{rank // 2} " in text
    assert f"[{hosts[0]}/launch] " in text and f"launcher on {hosts[1]}: all 2 ranks" in text
    if launcher == "mpirun":  # one mpirun on the first host started both agents
        assert f"mpirun on {hosts[0]}: /usr/bin/mpirun" in text
        assert f"one launcher agent on each of 2 host(s) ({','.join(hosts)}), started by " \
               "Open MPI's mpirun" in text
    assert summary["checkpoint"].startswith("/root/.ringflow/checkpoints/tp_hosts/")
    assert summary["checkpoint"].endswith("/train/step-00000010")


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_a_rank_failing_on_the_second_host_fails_the_task_naming_that_host(
        two_hosts, ns_hosts, tmp_path, launcher):
    """The data file exists on the first host only: the second host's ranks cannot read it
    (a spec the job refuses: not retried)."""
    data = "/root/tp-hosts-data.npz"
    first = ns_hosts[0]
    first.run(["/usr/bin/python3", "-c",
               "import numpy as np; r = np.random.default_rng(0); "
               f"np.savez('{data}', x=r.standard_normal((64, 8)), y=r.integers(0, 4, 64))"])
    op = make(two_hosts, data=data, launcher=launcher)
    with pytest.raises(AirflowFailException) as err:
        op.execute(ctx(f"run-{uuid.uuid4().hex[:8]}"))
    message = str(err.value)
    second = two_hosts[0][1]
    assert message.startswith("training failed: rank ") and f" on host {second} " in message
    assert "tp-hosts-data.npz" in message and "(not retried:" in message
    first.run(["rm", "-f", data])


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_a_folder_one_host_cannot_write_fails_before_any_agent_starts_naming_it(
        two_hosts, ns_hosts, launcher):
    """The second host's folder is immutable (chattr +i: the login is root, which ignores
    modes); the check runs on every host before anything starts, not retried."""
    first, second = list(ns_hosts)[:2]
    folder = second.home / "immutable"
    folder.mkdir(exist_ok=True)
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    run = f"run-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(RingflowFolderException) as err:
            make(two_hosts, launcher=launcher, checkpoint_dir="immutable/ckpt").execute(
                ctx(run, max_tries=3))
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert isinstance(err.value, AirflowFailException)
    assert str(err.value) == (f"checking the job's folders failed: host {second.address!r}: "
                              "checkpoint_dir immutable/ckpt is not writable: Operation not "
                              "permitted")
    assert not list((first.home / ".ringflow" / "runs" / "tp_hosts" / run).rglob("spec.json"))
    assert not [h for h in (first.home / ".ringflow").rglob("handle.json")
                if run in h.read_text()]  # no job folder of the run


@pytest.mark.parametrize(("launcher", "how"), [("ssh", "symlink"), ("mpirun", "owner")])
def test_a_state_folder_that_is_a_symlink_or_another_users_is_refused_naming_host_and_path(
        two_hosts, ns_hosts, launcher, how):
    """The job folders' state folder (.ringflow/jobs in the login's home) is a symlink to
    another folder, or belongs to another user (uid 4242), on the host whose supervisor
    starts there (mpirun: the first; ssh: the second, the first's part is then stopped):
    nothing is written there, and the task fails at once (not retried)."""
    host = list(ns_hosts)[1 if launcher == "ssh" else 0]
    state, elsewhere = host.home / ".ringflow" / "jobs", host.home / "elsewhere"
    kept = state.with_name("jobs.kept")
    state.mkdir(parents=True, exist_ok=True)
    state.rename(kept)
    if how == "symlink":
        elsewhere.mkdir(exist_ok=True)
        state.symlink_to("/root/elsewhere")
        said = "is a symlink"
    else:
        state.mkdir()
        os.chown(state, 4242, 4242)
        said = "is owned by uid 4242, not by this user (uid 0)"
    try:
        with pytest.raises(RingflowFolderException) as err:
            make(two_hosts, launcher=launcher).execute(ctx(f"run-{uuid.uuid4().hex[:8]}",
                                                           max_tries=3))
        assert isinstance(err.value, AirflowFailException)
        assert str(err.value) == (
            f"starting the job failed: host {host.address!r}: .ringflow/jobs {said}: "
            "ringflow keeps a job's folder only in real folders of its user")
        assert list(elsewhere.rglob("*")) == [] and list(state.rglob("*")) == []
    finally:
        state.unlink() if state.is_symlink() else shutil.rmtree(state)
        shutil.rmtree(elsewhere, ignore_errors=True)
        kept.rename(state)


def run_in_thread(op, context):
    outcome: dict = {}

    def target():
        try:
            outcome["result"] = op.execute(context)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def long_job(two_hosts, **overrides):
    args = dict(steps=100000, checkpoint_every=5, dtype="float32",
                model_args={**MLP, "hidden_size": 256}, global_batch_size=256)
    return make(two_hosts, **{**args, **overrides})


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_on_kill_stops_every_agent_and_a_retry_resumes_on_every_host(two_hosts, launcher):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    op = long_job(two_hosts, launcher=launcher)
    thread, outcome = run_in_thread(op, ctx(run_id))
    wait_until(lambda: "step 12/" in log_text(op), 120, "training to pass step 12")
    started = time.monotonic()
    op.on_kill()
    assert time.monotonic() - started < 2.5
    thread.join(30)

    assert "was killed (on_kill)" in str(outcome["error"])
    # the retry trains 20 steps past the last the first try logged (it may have run far past
    # step 12 before the kill, on a quiet machine)
    steps = max(int(n) for n in re.findall(r"step (\d+)/", log_text(op))) + 20
    retry = long_job(two_hosts, steps=steps, launcher=launcher)
    # the first try's agents may still be stopping: the retry's launch stops what is left
    summary = retry.execute(ctx(run_id, try_number=2))
    resumed = summary["resumed_from"]
    assert resumed is not None and 10 <= resumed < steps - 20 + 5 and resumed % 5 == 0
    assert summary["loss_history"][0][0] == resumed + 1 and summary["steps"] == steps
    assert f"resuming from step {resumed}" in log_text(retry)


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_sigkill_of_the_task_process_stops_every_agent(two_hosts, ns_hosts, tmp_path,
                                                       launcher):
    hosts, conns = two_hosts
    args = dict(task_id="train", hosts=hosts, ssh_conn_id=conns, python="/usr/bin/python3",
                model="mlp", steps=100000, log_every=1, model_args={"hidden_size": 256},
                tensor_parallel_degree=2, checkpoint_dir=None, launcher=launcher)
    proc = task_process.start(tmp_path, TPTrainOperator, args, "d", "r-sigkill", max_tries=0)
    try:
        task_process.wait_for_line(proc, "step 3/", 120)
        assert all(ns_hosts[i].leftovers() for i in range(2))   # the job runs on both
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    # no later try could attach (no retries): the follows' channels end with the task
    # process, and their supervisors stop the job
    for i in range(2):
        wait_until(lambda i=i: not ns_hosts[i].leftovers(), 15,
                   f"{hosts[i]}: the agent and its ranks to stop after the SIGKILL")



def test_hosts_and_connections_are_checked_before_anything_starts(two_hosts):
    hosts = two_hosts[0]
    for overrides, message in [
        ({"hosts": f"{hosts[0]},{hosts[0]}"}, "appears more than once"),
        ({"hosts": "10.0.0"}, "neither an IPv4 address"),
        ({"ssh_conn_id": {hosts[0]: "c"}}, f"names no connection for host(s) {hosts[1]}"),
        ({"launcher": "torchrun"}, "launcher must be one of ssh, mpirun"),
        ({"python": "-c"}, "python must be an interpreter's name or path"),
        ({"global_batch_size": 7}, "global_batch_size 7 is not divisible by the "
                                   "data-parallel degree 2"),
        ({"base_port": 80}, "must lie in 1024..65535"),
    ]:
        with pytest.raises(AirflowFailException, match=None) as err:
            make(two_hosts, **overrides).execute(ctx("bad"))
        assert message in str(err.value), (overrides, str(err.value))
    with pytest.raises(AirflowException, match="preflight failed"):
        make(two_hosts, python="/usr/bin/no-such-python").execute(ctx("nopy"))


def rank_pid(host, rank: int) -> int | None:
    """The pid (in the host's namespace) of the training process of `rank`, if running."""
    found = host.sh(
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
        f"grep -qx PADDLE_TRAINER_ID={rank} && grep -q ringflow.train $p/cmdline 2>/dev/null "
        "&& echo ${p#/proc/}; done")
    pids = [int(p) for p in found.stdout.split()]
    return min(pids) if pids else None


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_a_rank_killed_on_the_second_host_mid_training_fails_the_task_within_15_s(
        two_hosts, ns_hosts, launcher):
    op = long_job(two_hosts, launcher=launcher)
    thread, outcome = run_in_thread(op, ctx(f"run-{uuid.uuid4().hex[:8]}"))
    wait_until(lambda: "step 5/" in log_text(op), 120, "training to pass step 5")
    pid = rank_pid(ns_hosts[1], 2)
    assert pid is not None
    ns_hosts[1].run(["kill", "-KILL", str(pid)])   # as the OOM killer would
    killed = time.monotonic()
    thread.join(15)
    assert not thread.is_alive(), "the task did not fail within 15 s of the rank's death"
    message = str(outcome["error"])
    second = two_hosts[0][1]
    launch = "\n".join(line for line in log_text(op).splitlines() if "/launch]" in line)
    assert message.startswith(f"training failed: rank 2 on host {second} (pid {pid}) failed "
                              "first with exit code 137 (128+9: SIGKILL)"), \
        f"{message[:300]}\n{launch}"
    assert time.monotonic() - killed < 15


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_a_deferred_job_on_two_hosts_reports_as_an_attached_one(two_hosts, ns_hosts,
                                                                launcher):
    """The triggerer's watch (asyncssh to each host) logs the progress lines the attached
    path logs, and execute_complete gives the same summary: the losses bitwise equal. The
    job's folders are private on every host."""
    states = [h.home / ".ringflow" / "jobs" for h in list(ns_hosts)[:2]]
    for state in states[:2 if launcher == "ssh" else 1]:  # mpirun: a supervisor on the first
        loosen(state)
    run = f"run-{uuid.uuid4().hex[:8]}"
    attached = make(two_hosts, launcher=launcher).execute(ctx(run))
    trigger_log = RecordingLog()
    deferred, trigger = execute_deferred(
        make(two_hosts, launcher=launcher, deferrable=True, poll_interval=0.5),
        ctx(f"{run}-d"), lambda: make(two_hosts, launcher=launcher, deferrable=True),
        log=trigger_log)
    assert deferred["loss_history"] == attached["loss_history"]
    assert (deferred["world_size"], deferred["hosts"]) == (4, attached["hosts"])
    progress = [m for _, m in trigger_log.records if m.startswith("step ")]
    assert [int(m.split()[1].split("/")[0]) for m in progress] == list(range(1, 11))
    hosts = two_hosts[0]
    assert any(m.startswith(f"[{hosts[1]}/rank 2] ") for _, m in trigger_log.records)
    assert trigger.offsets and all(v > 0 for v in trigger.offsets.values())
    assert [not_private(state) if state.exists() else [] for state in states] == [[], []]


def test_killing_a_deferred_job_stops_it_on_every_host_within_10_s(two_hosts, ns_hosts):
    """A user marks the deferred task failed: the triggerer cancels the trigger and calls its
    on_kill, which stops every part of the job."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    op = long_job(two_hosts, deferrable=True, poll_interval=0.5)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx(f"run-{uuid.uuid4().hex[:8]}"))
    trigger = remake(deferred.value.trigger)
    trigger._log = RecordingLog()

    async def watch_then_kill() -> float:
        task = asyncio.ensure_future(first_event(trigger, 300))
        while not any(m.startswith("step 3/") for _, m in trigger._log.records):
            await asyncio.sleep(0.2)
        task.cancel()
        started = time.monotonic()
        await trigger.on_kill()
        return started

    started = asyncio.run(watch_then_kill())
    for host in list(ns_hosts)[:2]:
        wait_until(lambda host=host: not host.leftovers(), 10, f"{host.address} to be empty")
    assert time.monotonic() - started < 10
