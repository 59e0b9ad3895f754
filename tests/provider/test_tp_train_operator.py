"""TPTrainOperator.execute / on_kill with real launcher and rank processes on this host.

These call ``execute()`` in-process with a minimal context (the task instance's ids), as
test_poprun_operator.py does; test_tp_train_airflow.py runs the operator through Airflow.
Every test tags its processes with an environment marker and checks through /proc that
none is left, and that no shared-memory segment is.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException

from ringflow.train.checkpoint import latest_checkpoint
from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowFolderException,
    RingflowJobFailedException,
    RingflowJobKilledException,
    RingflowJobRefusedException,
)
from ringflow_provider.operators.tp_train import TPTrainOperator
from ringflow_provider.tp_train.report import read_history
from tests.procs import marked_processes
from tests.provider import task_process
from tests.provider.conftest import REPO, wait_until
from tests.provider.contexts import TaskInstanceStub
from tests.provider.job_folders import loosen, not_private
from tests.provider.test_poprun_operator import RecordingLog

pytestmark = [pytest.mark.multiproc]
SECRET = "s3cr3t-" + "5ab" * 8


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries TP_TEST_MARK=<mark>."""
    return marked_processes("TP_TEST_MARK", mark)


def shm_left() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith("ringflow-")]


@pytest.fixture
def make(tmp_path):
    """An operator on a small MLP job in tmp_path, its log recorded; checks afterwards that
    nothing it started is still running."""
    made = []

    def factory(**overrides):
        mark = uuid.uuid4().hex
        args = dict(task_id="train", model="mlp", model_args={"input_size": 8,
                                                              "hidden_size": 16,
                                                              "num_classes": 4},
                    steps=12, log_every=4, tensor_parallel_degree=2, nproc_per_host=2,
                    checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=4,
                    log_dir=str(tmp_path / "logs"),
                    extra_env={"TP_TEST_MARK": mark, "PYTHONPATH": str(REPO)},
                    allow_unsafe_env=True)
        args.update(overrides)
        op = TPTrainOperator(**args)
        op._cached_logger = RecordingLog()
        op.mark = mark
        made.append(op)
        return op

    yield factory
    for op in made:
        wait_until(lambda op=op: not marked(op.mark), 15, "the job's processes to end")


def ctx(try_number: int = 1, run_id: str = "run1", events=None, max_tries: int = 0,
        map_index: int = -1) -> dict:
    ti = TaskInstanceStub("tp_test", "train", run_id, try_number, max_tries, map_index)
    context = {"ti": ti}
    if events is not None:
        context["outlet_events"] = events
    return context


def log_text(op) -> str:
    return "\n".join(message for _, message in op.log.records)


class Events(dict):
    """Stands in for Airflow's outlet_events accessor: ``events[asset].extra = {...}``."""

    def __missing__(self, key):
        self[key] = SimpleNamespace(extra={})
        return self[key]


def test_a_job_returns_its_summary_logs_progress_and_writes_checkpoints(make, tmp_path):
    op = make()
    summary = op.execute(ctx())
    assert set(summary) == {"final_loss", "loss_history", "samples_per_s", "steps",
                            "world_size", "mp_degree", "dp_degree", "checkpoint", "log_dir",
                            "plot", "resumed_from", "loss_history_file"}
    assert [s for s, _ in summary["loss_history"]] == [1, 4, 8, 12]
    assert summary["loss_history_file"] == str(tmp_path / "logs" / "loss_history.jsonl")
    assert read_history(Path(summary["loss_history_file"])) == [
        tuple(point) for point in summary["loss_history"]]
    assert summary["final_loss"] == summary["loss_history"][-1][1]
    assert (summary["steps"], summary["world_size"], summary["mp_degree"],
            summary["dp_degree"], summary["resumed_from"]) == (12, 2, 2, 1, None)
    assert summary["checkpoint"] == str(tmp_path / "ckpt" / "step-00000012")
    assert sorted(p.name for p in (tmp_path / "ckpt" / "step-00000012").iterdir()) == [
        "manifest-host-0.json", "rank-0.npz", "rank-1.npz"]
    text = log_text(op)
    assert "step 8/12  loss " in text and "samples/s  eta " in text
    assert "[train] metric" not in text            # machine lines become progress lines
    assert "loss by step:" in text
    # each progress record carries its numbers as fields (what the UI's views read)
    progress = [f for (_, m), f in zip(op.log.records, op.log.fields) if m.startswith("step ")]
    assert [[f["step"], f["loss"]] for f in progress] == summary["loss_history"]
    assert all(set(f) == {"step", "loss", "lr", "samples_per_s"} for f in progress)
    assert (tmp_path / "logs" / "workerlog.1").exists()
    assert shm_left() == []


def test_amp_and_recompute_reach_the_job(make, tmp_path):
    op = make(amp="True", recompute="True", steps=4, model_args={
        "input_size": 8, "hidden_size": 16, "num_classes": 4, "num_layers": 2})
    summary = op.execute(ctx())
    spec = json.loads((tmp_path / "logs" / "spec.json").read_text())
    assert (spec["amp"], spec["recompute"]) == (True, True)
    assert "amp, recompute" in log_text(op)          # the ranks' job line
    assert summary["steps"] == 4 and math.isfinite(summary["final_loss"])


def test_gradient_accumulation_steps_reaches_the_job(make, tmp_path):
    op = make(gradient_accumulation_steps="2", steps=4, model_args={
        "input_size": 8, "hidden_size": 16, "num_classes": 4, "num_layers": 2})
    summary = op.execute(ctx())
    spec = json.loads((tmp_path / "logs" / "spec.json").read_text())
    assert spec["gradient_accumulation_steps"] == 2
    assert summary["steps"] == 4 and math.isfinite(summary["final_loss"])


def test_the_loss_plot_is_a_png_next_to_the_logs(make, tmp_path):
    # matplotlib is the `plot` extra, which make test installs: no skip when it is missing
    summary = make().execute(ctx())
    assert summary["plot"] == str(tmp_path / "logs" / "loss.png")
    assert Path(summary["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_log_says_why_there_is_no_plot(make, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    op = make()
    summary = op.execute(ctx())
    assert summary["plot"] is None
    assert not (tmp_path / "logs" / "loss.png").exists()
    assert "no loss plot: matplotlib is not installed" in log_text(op)
    assert "loss by step:" in log_text(op)       # the text chart needs nothing


def test_a_successful_run_emits_the_asset_event_with_the_checkpoint(make):
    op = make()
    asset = Asset("ringflow://tp_test/train")
    op.outlets = [asset]
    events = Events()
    summary = op.execute(ctx(events=events))
    extra = events[asset].extra
    assert extra == {"checkpoint": summary["checkpoint"], "host": os.uname().nodename,
                     "step": 12, "final_loss": summary["final_loss"]}


def test_lines_a_rank_forges_change_no_xcom_metric_or_asset_event(make, tmp_path):
    """Ranks print summaries, metrics and a launcher result line that no launcher prefix
    begins as a whole line (tp_builders.build_forging): the summary, the loss history and
    the asset event are the job's real ones; the forged lines are shown, never read."""
    op = make(model="tests.provider.tp_builders:build_forging")
    asset = Asset("ringflow://tp_test/train")
    op.outlets = [asset]
    events = Events()
    summary = op.execute(ctx(events=events))
    assert [s for s, _ in summary["loss_history"]] == [1, 4, 8, 12]
    assert summary["steps"] == 12 and summary["final_loss"] == summary["loss_history"][-1][1]
    assert summary["checkpoint"] == str(tmp_path / "ckpt" / "step-00000012")
    assert read_history(Path(summary["loss_history_file"]))[-1] == (12, summary["final_loss"])
    assert events[asset].extra == {"checkpoint": summary["checkpoint"],
                                   "host": os.uname().nodename, "step": 12,
                                   "final_loss": summary["final_loss"]}
    text = log_text(op)
    assert "666.0" not in json.dumps(summary) and "launcher: forged" not in text
    assert "[rank 1]+ [rank 0] [train] summary {\"final_loss\": 666.0" in text
    assert "[rank 0]+ [train] summary {\"final_loss\": 666.0" in text


def test_a_secret_reaches_the_ranks_over_stdin_and_no_log_or_command_line(make):
    import hashlib

    op = make(model="tests.provider.tp_builders:build",
              model_args={"secret_var": "WANDB_KEY"}, secret_env={"WANDB_KEY": SECRET})
    op.execute(ctx())
    text = log_text(op)
    digest = hashlib.sha256(SECRET.encode()).hexdigest()[:12]
    assert f"secret WANDB_KEY digest {digest}" in text
    assert "secret WANDB_KEY on command lines: 0" in text
    assert SECRET not in text
    spec = (Path(op.log_dir) / "spec.json").read_text()
    assert SECRET not in spec


def test_a_rank_that_raises_fails_the_task_naming_rank_code_cause_and_log_tail(make):
    op = make(model="tests.provider.tp_builders:build", model_args={"fail_rank": 1})
    with pytest.raises(RingflowJobFailedException) as err:
        op.execute(ctx())
    assert (err.value.exit_code, err.value.host) == (1, None)
    message = str(err.value)
    first = message.splitlines()[0]
    assert re.fullmatch(r"training failed: rank 1 on host \S+ \(pid \d+\) failed first "
                        r"with exit code 1: RuntimeError: rank 1 fails on purpose while "
                        r"building the model; last \d+ lines of (.*)/workerlog\.1:", first)
    assert first.endswith(f"{op.log_dir}/workerlog.1:")
    assert "in build_model" in message                       # the traceback, from the log
    assert not isinstance(err.value, AirflowFailException)    # a retry may help


@pytest.mark.parametrize("overrides, message", [
    ({"steps": 0}, "steps: Input should be greater than or equal to 1 (got 0)"),
    ({"global_batch_size": 31, "tensor_parallel_degree": 1},
     "global_batch_size 31 is not divisible by the data-parallel degree 2"),
    ({"tensor_parallel_degree": 3}, "does not divide"),
    ({"optimizer": '{"type": "adam", "beta3": 1}'}, "unknown argument 'beta3' for adam"),
    ({"nproc_per_host": "two"}, "nproc_per_host must be an integer >= 1, got 'two'"),
    ({"extra_env": {"LD_PRELOAD": "/tmp/x.so"}, "allow_unsafe_env": False},
     "extra_env: LD_PRELOAD would load code into every rank"),
    ({"extra_env": {}, "secret_env": {"PYTHONSTARTUP": "/x.py"}, "allow_unsafe_env": False},
     "secret_env: PYTHONSTARTUP would load code into every rank"),
    ({"gradient_accumulation_steps": "2", "amp": "True"},
     "gradient_accumulation_steps 2 does not combine with amp"),
], ids=["steps", "batch", "degree", "optimizer", "nproc", "unsafe-env", "unsafe-secret-env",
        "accumulation-amp"])
def test_a_bad_value_fails_before_anything_starts_naming_it(make, tmp_path, overrides,
                                                           message):
    op = make(**overrides)
    with pytest.raises(RingflowConfigException, match=re.escape(message)) as err:
        op.execute(ctx())
    assert isinstance(err.value, AirflowFailException)
    assert not (tmp_path / "logs").exists()


def test_a_secret_in_a_bad_value_is_masked_in_the_error(make):
    op = make(secret_env={"API_TOKEN": SECRET}, model=f"bad model {SECRET}")
    op.render_template_fields({})
    with pytest.raises(AirflowFailException) as err:
        op.execute(ctx())
    assert SECRET not in str(err.value) and "***" in str(err.value)


@pytest.fixture
def immutable(tmp_path):
    """A folder nothing can be added to, root included (chattr +i: root ignores modes)."""
    folder = tmp_path / "immutable"
    folder.mkdir()
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("field", ["checkpoint_dir", "log_dir"])
def test_a_folder_that_cannot_be_written_fails_before_any_rank_starts_not_retried(
        make, immutable, field):
    op = make(**{field: str(immutable / "job")})
    with pytest.raises(RingflowFolderException) as err:
        op.execute(ctx(max_tries=3))
    assert isinstance(err.value, AirflowFailException)
    assert str(err.value) == (f"checking the job's folders failed: host "
                              f"{socket.gethostname()!r}: {field} {immutable}/job is not "
                              "writable: Operation not permitted")
    assert "started under ringflow's supervisor" not in log_text(op)
    assert not (Path(op.log_dir) / "spec.json").exists()


def test_a_checkpoint_that_cannot_be_written_fails_the_task_naming_it_not_retried(
        make, tmp_path):
    """The checkpoint folder becomes immutable (chattr +i) once step 4's checkpoint is
    complete, while the ranks wait at a gate before step 5 (tests.runtime.train.gated_model);
    the save of step 8 fails, step 4's stays complete."""
    from ringflow.train.checkpoint import latest_checkpoint, read_complete

    root, gate = tmp_path / "ckpt", tmp_path / "gate"
    op = make(model="tests.runtime.train.gated_model:build", steps=8,
              model_args={"input_size": 8, "hidden_size": 16, "num_classes": 4,
                          "gate": str(gate), "gate_step": 4})

    def break_the_folder():
        wait_until(lambda: read_complete(str(root), 4) is not None, 60, "step 4's checkpoint")
        subprocess.run(["chattr", "+i", str(root)], check=True)
        gate.touch()

    breaker = threading.Thread(target=break_the_folder, daemon=True)
    breaker.start()
    try:
        with pytest.raises(RingflowJobRefusedException) as err:
            op.execute(ctx(max_tries=3))
    finally:
        breaker.join(60)
        subprocess.run(["chattr", "-i", str(root)], check=True)
    assert isinstance(err.value, AirflowFailException) and err.value.exit_code == 4
    message = str(err.value)
    assert f"the checkpoint of step 8 could not be written to {root}/step-00000008: " \
           "Operation not permitted; last good checkpoint: " in message
    assert message.endswith("(not retried: a checkpoint could not be written (permission, "
                            "disk full); the previous checkpoint is intact)")
    assert latest_checkpoint(str(root)).step == 4


@pytest.mark.parametrize("deferrable", [False, True])
def test_the_job_folder_is_private_attached_and_detached(make, monkeypatch, tmp_path,
                                                         deferrable):
    """Folders 0700, files 0600, the state folder tightened from the 0755 it had."""
    from tests.provider.deferral import execute_deferred

    monkeypatch.setenv("RINGFLOW_HOME", str(tmp_path / "home"))
    loosen(tmp_path / "home" / "jobs")
    args = dict(steps=4, deferrable=deferrable, poll_interval=0.5)
    if deferrable:
        summary, _ = execute_deferred(make(**args), ctx(), lambda: make(**args))
    else:
        summary = make(**args).execute(ctx())
    assert summary["steps"] == 4
    assert not_private(tmp_path / "home" / "jobs") == []
    assert [p.name for p in (tmp_path / "home" / "jobs").glob("*/try-1/status.json")] == [
        "status.json"]


def test_a_state_folder_that_is_a_symlink_is_refused_before_the_job_starts(
        make, monkeypatch, tmp_path):
    monkeypatch.setenv("RINGFLOW_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "home" / "jobs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RingflowFolderException) as err:
        make().execute(ctx(max_tries=3))
    assert str(err.value) == (
        f"starting the job failed: host {socket.gethostname()!r}: {tmp_path}/home/jobs is a "
        "symlink: ringflow keeps a job's folder only in real folders of its user")
    assert list((tmp_path / "elsewhere").iterdir()) == []


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


def slow(make, **overrides):
    """A job long enough to be killed mid-training."""
    return make(steps=100000, log_every=1, checkpoint_every=5,
                model_args={"input_size": 8, "hidden_size": 512, "num_classes": 4},
                global_batch_size=512, **overrides)


def test_on_kill_stops_every_rank_within_the_kill_window_and_execute_raises(make):
    op = slow(make)
    thread, outcome = run_in_thread(op, ctx())
    wait_until(lambda: "step 3/" in log_text(op), 60, "training to start")
    started = time.monotonic()
    op.on_kill()
    assert time.monotonic() - started < 2.0
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome["error"], RingflowJobKilledException)
    assert "was killed (on_kill)" in str(outcome["error"])
    wait_until(lambda: not marked(op.mark), 8, "every rank to be gone")
    assert shm_left() == []


def test_a_retry_resumes_from_the_newest_checkpoint_and_says_so(make, tmp_path):
    op = slow(make)
    thread, _ = run_in_thread(op, ctx())
    wait_until(lambda: "step 12/" in log_text(op), 60, "step 12")
    op.on_kill()
    thread.join(10)
    wait_until(lambda: not marked(op.mark), 8, "the first try to end")
    complete = sorted(int(d.name.split("-")[1]) for d in (tmp_path / "ckpt").iterdir()
                      if (d / "manifest-host-0.json").exists())
    newest = complete[-1]
    assert newest >= 10 and newest % 5 == 0
    retry = make(steps=newest + 3, log_every=1, checkpoint_every=5,
                 model_args={"input_size": 8, "hidden_size": 512, "num_classes": 4},
                 global_batch_size=512, log_dir=str(tmp_path / "logs2"))
    summary = retry.execute(ctx(try_number=2))
    assert f"try 2: resuming from step {newest}" in log_text(retry)
    assert {"resume_step": newest} in retry.log.fields
    assert summary["resumed_from"] == newest
    assert [s for s, _ in summary["loss_history"]] == [newest + 1, newest + 2, newest + 3]


def test_sigkill_of_the_task_process_leaves_no_rank_and_no_segment(tmp_path):
    """Its last try (no retry could attach): the job stops with the task process."""
    mark = uuid.uuid4().hex
    args = dict(task_id="train", model="mlp", steps=100000, log_every=1,
                model_args={"hidden_size": 512}, tensor_parallel_degree=2, checkpoint_dir=None,
                log_dir=str(tmp_path / "logs"),
                extra_env={"TP_TEST_MARK": mark, "PYTHONPATH": str(REPO)},
                allow_unsafe_env=True)
    proc = task_process.start(tmp_path, TPTrainOperator, args, "d", "r", max_tries=0)
    try:
        task_process.wait_for_line(proc, "step 3/", 60)
        assert len(marked(mark)) >= 3       # the launcher and its two ranks
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not marked(mark), 15, "the launcher and ranks to stop")
        assert shm_left() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


def test_a_nan_loss_fails_without_retry_naming_the_step(make):
    op = make(model="mlp", optimizer={"type": "sgd", "learning_rate": 1e30})
    with pytest.raises(RingflowJobRefusedException) as err:
        op.execute(ctx())
    assert isinstance(err.value, AirflowFailException) and err.value.exit_code == 3
    message = str(err.value)
    assert "the loss is nan" in message or "the loss is inf" in message
    assert "at step" in message and "not retried" in message


def killed_task_process(tmp_path, run_id: str, until: str, **args) -> None:
    """Try 1 of a task that may be retried, in a task process of its own, SIGKILLed once its
    log shows a line starting with `until` (a worker dying mid-job)."""
    task_process.killed(tmp_path, TPTrainOperator, {"task_id": "train", **args}, "tp_test",
                        run_id, until)


def job_args(tmp_path, mark: str, **overrides) -> dict:
    args = dict(model="mlp", model_args={"input_size": 8, "hidden_size": 256,
                                         "num_classes": 4},
                global_batch_size=256, steps=150, log_every=1, tensor_parallel_degree=2,
                nproc_per_host=2, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=5,
                log_dir=str(tmp_path / "logs"),
                extra_env={"TP_TEST_MARK": mark, "PYTHONPATH": str(REPO)},
                allow_unsafe_env=True)
    return {**args, **overrides}


def rank_process(pid: int) -> bool:
    try:
        return b"PADDLE_TRAINER_ID=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_a_retry_attaches_to_the_job_its_killed_task_process_left_as_one_run(make, tmp_path):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    mark = uuid.uuid4().hex
    killed_task_process(tmp_path, run_id, "step 5/", **job_args(tmp_path, mark, steps=1000))
    # the ranks paused (at once: a step takes about a millisecond) while try 2 attaches, so
    # lines come after it did however fast they are
    ranks = [pid for pid in marked(mark) if rank_process(pid)]
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    assert len(ranks) == 2, f"the job did not outlive the task process of try 1: {ranks}"
    time.sleep(1.0)
    assert marked(mark), "the job did not outlive the task process of try 1"
    retry = make(**job_args(tmp_path, mark, steps=1000, log_dir=str(tmp_path / "logs2")))
    retry.mark = mark
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        summary=retry.execute(ctx(try_number=2, run_id=run_id, max_tries=1))))
    thread.start()
    try:
        wait_until(lambda: any(m.startswith("try 2: attaching") for _, m in retry.log.records),
                   60, "try 2 to attach")
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    thread.join(120)
    assert not thread.is_alive() and "summary" in result, "try 2 did not end"
    summary = result["summary"]
    attach = [m for _, m in retry.log.records if m.startswith("try 2: attaching")]
    assert len(attach) == 1 and re.fullmatch(
        r"try 2: attaching to the running job of try 1 at step \d+/1000", attach[0]), attach
    assert [s for s, _ in summary["loss_history"]] == list(range(1, 1001))  # one run
    assert summary["resumed_from"] is None and summary["steps"] == 1000
    progress = [m for m in log_text(retry).splitlines() if m.startswith("step ")]
    assert progress and int(progress[0].split()[1].split("/")[0]) > 5  # new lines only


def test_a_restarting_retry_stops_with_its_task_and_resumes_from_a_checkpoint(make, tmp_path):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    mark = uuid.uuid4().hex
    # try 1 cannot finish before the kill lands (a quiet machine trains 150 steps in the
    # moments the stop takes); the retry trains 20 steps past its newest checkpoint
    killed_task_process(tmp_path, run_id, "step 12/",
                        **job_args(tmp_path, mark, on_existing="restart", steps=100000))
    wait_until(lambda: not marked(mark), 15, "the job to stop with its task process")
    assert shm_left() == []
    # the newest complete one: a kill between the ranks' shards leaves a newer folder that
    # is not a checkpoint
    newest = latest_checkpoint(str(tmp_path / "ckpt")).step
    retry = make(**job_args(tmp_path, mark, on_existing="restart", steps=newest + 20,
                            log_dir=str(tmp_path / "logs2")))
    retry.mark = mark
    summary = retry.execute(ctx(try_number=2, run_id=run_id, max_tries=1))
    resumed = summary["resumed_from"]
    assert resumed == newest and resumed >= 10 and resumed % 5 == 0
    assert f"try 2: resuming from step {resumed}" in log_text(retry)
    assert summary["loss_history"][0][0] == resumed + 1


def test_a_job_nobody_watches_stops_itself_when_its_lease_runs_out(tmp_path):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    mark = uuid.uuid4().hex
    killed_task_process(tmp_path, run_id, "step 3/",
                        **job_args(tmp_path, mark, steps=100000, lease_timeout=4))
    killed = time.monotonic()
    assert marked(mark), "the job did not outlive the task process"
    wait_until(lambda: not marked(mark), 30, "the job to stop when its lease ran out")
    stopped_after = time.monotonic() - killed
    assert stopped_after >= 2.5   # it outlived its watcher until the lease ran out
    (status,) = [json.loads(p.read_text()) for p in
                 Path(os.environ["RINGFLOW_HOME"], "jobs").glob("*/try-1/status.json")
                 if json.loads((p.parent / "handle.json").read_text())["task"]["run_id"]
                 == run_id]
    assert status["stopped_by"] == "lease" and "not renewed for 4 s" in status["cause"]
    assert shm_left() == []


def test_mapped_instances_of_a_task_run_side_by_side_in_their_own_folders(make):
    """Two instances of one mapped task (same dag, task and run) deferred at once: each its
    own job, folder, logs and checkpoints (they must not take each other for an earlier
    try), and each its own summary."""
    from airflow.sdk.exceptions import TaskDeferred

    from tests.provider.deferral import first_event, remake

    home = Path(os.environ["RINGFLOW_HOME"])
    run_id = f"mapped-{uuid.uuid4().hex[:8]}"
    ops, deferred = [], []
    for index in (0, 1):
        op = make(deferrable=True, poll_interval=0.5, checkpoint_dir="default", log_dir=None,
                  steps=8, seed=index)
        with pytest.raises(TaskDeferred) as raised:
            op.execute(ctx(run_id=run_id, map_index=index))
        ops.append(op)
        deferred.append(raised.value)
    summaries = []
    for index, (op, item) in enumerate(zip(ops, deferred)):
        event = asyncio.run(first_event(remake(item.trigger), 120))
        assert event.payload["status"] == "success", event.payload
        summaries.append(op.execute_complete(ctx(run_id=run_id, map_index=index),
                                             event.payload))
    checkpoints = [s["checkpoint"] for s in summaries]
    assert checkpoints == [
        str(home / "checkpoints" / "tp_test" / run_id / "train" / f"map-{i}" / "step-00000008")
        for i in (0, 1)]
    assert [s["log_dir"] for s in summaries] == [
        str(home / "runs" / "tp_test" / run_id / "train" / f"map-{i}" / "try-1")
        for i in (0, 1)]
    assert summaries[0]["loss_history"] != summaries[1]["loss_history"]   # seeds 0 and 1
    folders = {p.parent.parent.name for p in (home / "jobs").glob("*/try-1/handle.json")
               if json.loads(p.read_text())["task"]["run_id"] == run_id}
    assert len(folders) == 2
