"""TPTrainOperator inside real Airflow: the example DAG parsed by a DagBag, and tasks run by
the `airflow` CLI (`tasks test`, `dags test`) on the run's Airflow home, their results read
back from Airflow's metadata database (XCom, asset events, task states).

Each CLI process carries an environment marker (RINGFLOW_TEST_MARK) that the launcher and ranks
inherit (a RINGFLOW_* variable: local ranks keep those of the worker's environment), so a test
can check through /proc that none of them is left.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from tests.procs import marked_processes
from tests.provider.conftest import REPO, VENV_BIN, wait_until
from tests.provider.test_tp_train_operator import shm_left

pytestmark = [pytest.mark.airflow, pytest.mark.multiproc]
DAG_ID = "ringflow_tp_train"
#: the example DAGs and their corpus, inside the package (dags/ imports them)
EXAMPLES = REPO / "provider" / "ringflow_provider" / "example_dags"


def airflow(*args: str, mark: str, timeout: float = 180,
            dags_folder: Path | None = None) -> subprocess.CompletedProcess:
    """An `airflow` CLI command on the run's home. A DAG file of a test's own is read from its
    folder as the DAG folder: Airflow 3.3's `dags test -f` refuses a file outside the DAG
    folder's bundle."""
    env = {**os.environ, "RINGFLOW_TEST_MARK": mark, "PYTHONPATH": str(REPO)}
    if dags_folder is not None:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    return subprocess.run([str(VENV_BIN / "airflow"), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries RINGFLOW_TEST_MARK=<mark>."""
    return marked_processes("RINGFLOW_TEST_MARK", mark)


def task_states(log: str) -> list[str]:
    """The states Airflow gave the task instance, in order, from its log. `airflow tasks
    test` exits 0 whatever the task's outcome (Airflow 3.3), so its log is what tells."""
    return re.findall(r"Task instance state updated .* new_state=(\w+)", log)


@pytest.fixture
def mark():
    """A marker for this test's processes; afterwards none of them may be alive."""
    value = uuid.uuid4().hex
    yield value
    wait_until(lambda: not marked(value), 15, "the job's processes to end")
    assert shm_left() == []


def newest_run(dag_id: str) -> tuple[str, str]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)
                              .order_by(DagRun.id.desc()).limit(1)).one()
        return run.run_id, str(run.state)


def task_result(dag_id: str, run_id: str, task_id: str = "train"):
    """(state, try number, XCom return value, extra of the asset event) of a task's run."""
    from airflow.models.asset import AssetEvent
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
            TaskInstance.task_id == task_id)).one()
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id,
            XComModel.task_id == task_id, XComModel.key == "return_value")).first()
        events = session.scalars(select(AssetEvent).where(
            AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)).all()
        return (str(ti.state), ti.try_number,
                XComModel.deserialize_value(row) if row is not None else None,
                [(event.asset.uri, dict(event.extra)) for event in events])


def test_the_example_dag_has_typed_params_in_sections_and_declares_its_asset():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Asset

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    # the DAGs live in the package; dags/ imports them, and Airflow files them under dags/
    # (the file a worker parses again to run a task)
    assert {dag_id: Path(d.fileloc).relative_to(REPO).as_posix()
            for dag_id, d in bag.dags.items()} == {
        DAG_ID: "dags/ringflow_tp_train.py",
        "ringflow_tp_train_evaluate": "dags/ringflow_tp_train.py",
        "ringflow_poprun": "dags/ringflow_poprun.py"}
    dag = bag.dags[DAG_ID]
    (task,) = dag.tasks
    assert (task.task_id, type(task).__name__, task.retries) == ("train", "TPTrainOperator", 1)
    assert task.outlets == [Asset("ringflow://ringflow_tp_train/train")]
    assert set(dag.params.keys()) == {
        "model", "steps", "global_batch_size", "tensor_parallel_degree", "nproc_per_host",
        "learning_rate", "optimizer_type", "seed", "log_every", "amp", "recompute",
        "hosts", "launcher", "ssh_conn_id", "python", "deferrable", "poll_interval",
        "on_existing", "sharding_stage"}
    for name in dag.params:
        schema = dag.params.get_param(name).schema
        assert schema.get("type") and schema.get("section"), name
        assert dag.params.get_param(name).description, name
    for name in ("steps", "global_batch_size", "tensor_parallel_degree", "nproc_per_host",
                 "log_every"):
        assert dag.params.get_param(name).schema["minimum"] == 1, name
    assert (dag.params["tensor_parallel_degree"], dag.params["nproc_per_host"],
            dag.params["model"]) == (2, 2, "transformer")
    assert (dag.params["amp"], dag.params["recompute"]) == (False, False)
    assert task.amp == "{{ params.amp }}" and task.recompute == "{{ params.recompute }}"
    # by default the job runs on this worker; the Hosts section moves it to SSH hosts
    assert (dag.params["hosts"], dag.params["launcher"], dag.params["ssh_conn_id"],
            dag.params["python"]) == (None, "ssh", "ssh_default", "python3")
    assert dag.params.get_param("launcher").schema["enum"] == ["ssh", "mpirun"]
    assert (task.hosts, task.launcher) == ("{{ params.hosts or '' }}", "{{ params.launcher }}")
    for value, rendered in ((None, ""), ("trainer-a,trainer-b", "trainer-a,trainer-b")):
        assert task.render_template(task.hosts, {"params": {"hosts": value}}) == rendered
    # how the job is watched: attached by default, deferrable on request
    assert (dag.params["deferrable"], dag.params["on_existing"]) == (False, "reattach")
    assert task.deferrable == "{{ params.deferrable }}"
    downstream = bag.dags["ringflow_tp_train_evaluate"]
    assert list(downstream.timetable.asset_condition.objects) == task.outlets
    # the transformer learns the checked-in corpus (5 % held out), the MLP its synthetic data
    corpus = str(EXAMPLES / "data" / "ringflow_corpus.txt")
    for model, data, fraction in (("transformer", corpus, "0.05"), ("mlp", "synthetic", "0")):
        context = {"params": {"model": model}}
        assert task.render_template(task.data, context, dag.get_template_env()) == data
        assert task.render_template(task.validation_fraction, context) == fraction
    assert (task.tokenizer, task.eval_every, task.ship_data) == ("char", 100, True)
    assert (dag.params["steps"], dag.params["learning_rate"]) == (600, 0.003)
    evaluate, find = sorted(downstream.tasks, key=lambda t: t.task_id)
    assert (find.task_id, type(evaluate).__name__) == ("find_model", "TPEvaluateOperator")
    assert find.inlets == task.outlets and evaluate.upstream_task_ids == {"find_model"}
    assert (evaluate.fail_if, evaluate.prompt, evaluate.max_new_tokens) == (
        {"val_loss": {"gt": 2.5}}, "The operator ", 200)


def test_the_example_dags_and_their_corpus_are_in_the_package():
    """As providers ship theirs: the modules in ringflow_provider.example_dags, the corpus
    declared as package data (setup.cfg) beside them and found there by the DAG, and dags/
    one import each (with the words Airflow's safe mode looks for in a DAG file)."""
    from fnmatch import fnmatch

    from setuptools.config.setupcfg import read_configuration

    from ringflow_provider.example_dags import ringflow_tp_train

    declared = read_configuration(str(REPO / "setup.cfg"))["options"]["package_data"]
    assert any(fnmatch("data/ringflow_corpus.txt", pattern)
               for pattern in declared["ringflow_provider.example_dags"])
    assert Path(ringflow_tp_train.CORPUS) == EXAMPLES / "data" / "ringflow_corpus.txt"
    assert Path(ringflow_tp_train.CORPUS).stat().st_size > 300_000
    for name in ("ringflow_tp_train", "ringflow_poprun"):
        assert (EXAMPLES / f"{name}.py").is_file()
        lines = [line for line in (REPO / "dags" / f"{name}.py").read_text().splitlines()
                 if line.startswith(("from ", "import "))]
        assert [line.split(" import ")[0] for line in lines] == [
            f"from ringflow_provider.example_dags.{name}"]
        assert "airflow" in (REPO / "dags" / f"{name}.py").read_text().lower()


def unigram_entropy(text: str) -> float:
    """Nats per character of a model that knows only how often each character occurs."""
    counts = np.array(list(collections.Counter(text).values()), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def run_id_of(out: subprocess.CompletedProcess, dag_id: str) -> str:
    """The run `airflow dags test` made (a scheduler of another test may add runs)."""
    found = re.findall(rf"DagRun Finished: dag_id={dag_id}, .*?run_id=([^,]+),",
                       out.stdout + out.stderr)
    assert found, (out.stdout + out.stderr)[-4000:]
    return found[-1]


@pytest.mark.slow
def test_the_demo_transformer_learns_the_corpus_and_the_evaluate_dag_gates_and_writes_text(
        airflow_home, mark):
    """The example DAG with its defaults (the job `make demo` runs): a char-level transformer
    on the corpus reaches a validation loss well below the corpus's unigram entropy (<= 0.8
    x); the evaluate DAG, started by hand, takes the Asset's newest event, evaluates that
    checkpoint to the job's validation loss, passes its gate and writes the text."""
    corpus = (EXAMPLES / "data" / "ringflow_corpus.txt").read_text(encoding="utf-8")
    entropy = unigram_entropy(corpus)
    assert 3.3 < entropy < 3.6, entropy                    # 3.446 nats per character
    out = airflow("dags", "test", DAG_ID, mark=mark, timeout=400)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    state, _, summary, events = task_result(DAG_ID, run_id_of(out, DAG_ID))
    assert state == "success" and summary["steps"] == 600
    print(f"unigram entropy {entropy:.4f} nats/char; validation loss at step 600 "
          f"{summary['val_loss']:.4f} ({summary['val_loss'] / entropy:.2f} x)")
    assert summary["val_loss"] <= 0.8 * entropy
    history = summary["val_loss_history"]
    assert [step for step, _ in history] == list(range(100, 601, 100))
    assert history[0][1] > history[-1][1] == summary["val_loss"]
    assert events[0][1]["val_loss"] == summary["val_loss"]
    evaluate = "ringflow_tp_train_evaluate"
    out = airflow("dags", "test", evaluate, mark=mark, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    state, _, result, _ = task_result(evaluate, run_id_of(out, evaluate), "evaluate")
    assert state == "success"
    assert result["checkpoint"] == summary["checkpoint"] and result["step"] == 600
    # the job's float32 model evaluated in one process: the same loss to float32's rounding
    assert result["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-6)
    assert result["prompt"] == "The operator " and len(result["generated"]) == 200
    assert result["prompt"] + result["generated"] in out.stdout + out.stderr  # the task log


@pytest.mark.slow
def test_airflow_tasks_test_trains_with_a_param_override(airflow_home, mark):
    out = airflow("tasks", "test", DAG_ID, "train", "-t", '{"steps": 30}', mark=mark)
    log = out.stdout + out.stderr
    assert (out.returncode, task_states(log)) == (0, ["success"]), log[-4000:]
    assert ("training transformer on this host: 2 ranks (mp 2 x dp 1), "
            "30 steps of 32 samples, float32, adam optimizer") in log
    assert "try 1: no complete checkpoint in" in log
    assert "step 10/30  loss " in log and "step 30/30  loss " in log
    assert "step 40/" not in log
    assert "loss by step:" in log and "loss plot: " in log


@pytest.mark.slow
def test_an_invalid_conf_is_refused_by_the_params_schema_naming_it(airflow_home, mark):
    out = airflow("tasks", "test", DAG_ID, "train", "-t", '{"steps": 0}', mark=mark)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Invalid input for param steps: 0 is less than the minimum of 1" in log
    assert "training transformer" not in log          # nothing started


@pytest.mark.slow
@pytest.mark.parametrize("conf, named", [
    ({"global_batch_size": 33, "tensor_parallel_degree": 1},
     "global_batch_size 33 is not divisible by the data-parallel degree 2"),
    ({"tensor_parallel_degree": 4}, "tensor_parallel_degree 4"),
], ids=["batch-not-divisible", "degree-above-ranks"])
def test_a_conf_the_schema_allows_but_the_job_refuses_fails_the_task_naming_it(
        airflow_home, mark, conf, named):
    out = airflow("tasks", "test", DAG_ID, "train", "-t", json.dumps(conf), mark=mark)
    log = out.stdout + out.stderr
    assert task_states(log) == ["failed"], log[-3000:]  # retries=1, yet not up_for_retry
    assert named in log, log[-3000:]
    assert "RingflowConfigException" in log           # an AirflowFailException: not retried
    assert "training transformer" not in log          # nothing started


@pytest.mark.slow
def test_a_dag_run_returns_the_summary_and_emits_the_asset_event(airflow_home, mark):
    conf = {"model": "mlp", "steps": 12, "log_every": 4, "seed": 3, "optimizer_type": "sgd",
            "learning_rate": 0.05}
    out = airflow("dags", "test", DAG_ID, "-c", json.dumps(conf), mark=mark)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    run_id, run_state = newest_run(DAG_ID)
    state, _, summary, events = task_result(DAG_ID, run_id)
    assert (run_state, state) == ("success", "success")
    assert [step for step, _ in summary["loss_history"]] == [1, 4, 8, 12]
    assert (summary["steps"], summary["world_size"], summary["mp_degree"],
            summary["dp_degree"], summary["resumed_from"]) == (12, 2, 2, 1, None)
    spec = json.loads((Path(summary["log_dir"]) / "spec.json").read_text())
    assert (spec["model"], spec["seed"], spec["optimizer"]) == (
        "mlp", 3, {"type": "sgd", "learning_rate": 0.05})          # the conf reached the job
    assert Path(summary["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert summary["checkpoint"].endswith("/train/step-00000012")
    assert events == [("ringflow://ringflow_tp_train/train", {
        "checkpoint": summary["checkpoint"], "host": os.uname().nodename, "step": 12,
        "final_loss": summary["final_loss"]})]
    # what `make demo` prints at the end, read through the REST API of an api-server the
    # script starts and stops (the mark fixture checks that it is gone)
    shown = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo_summary.py"), DAG_ID, "train"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "RINGFLOW_TEST_MARK": mark})
    assert shown.returncode == 0, (shown.stdout + shown.stderr)[-4000:]
    first = summary["loss_history"][0]
    assert shown.stdout.splitlines()[1:4] == [
        f"{DAG_ID} run {run_id}: success",
        f"loss {first[1]:.4f} at step 1 -> {summary['final_loss']:.4f} at step 12  (2 ranks: "
        f"mp 2 x dp 1, {summary['samples_per_s']:,.0f} samples/s)",
        f"checkpoint  {summary['checkpoint']}"]
    assert f"asset event ringflow://ringflow_tp_train/train {events[0][1]}" in shown.stdout


@pytest.mark.slow
def test_a_debug_run_publishes_no_asset_event_and_a_dag_run_still_does(
        airflow_home, airflow_services, mark):
    """`airflow tasks test` must not trigger the DAGs scheduled on the model's Asset
    (ringflow_tp_train_evaluate); the events are read through the REST API."""
    conf = {"model": "mlp", "steps": 4, "log_every": 2, "tensor_parallel_degree": 1,
            "nproc_per_host": 1}
    debug = airflow("tasks", "test", DAG_ID, "train", "-t", json.dumps(conf), mark=mark)
    log = debug.stdout + debug.stderr
    assert task_states(log) == ["success"], log[-4000:]
    assert ("no event on the Asset ringflow://ringflow_tp_train/train: this is a debug run "
            "(airflow tasks test), which does not trigger the DAGs scheduled on it") in log
    real = airflow("dags", "test", DAG_ID, "-c", json.dumps(conf), mark=mark)
    assert real.returncode == 0, (real.stdout + real.stderr)[-4000:]
    run_id, _ = newest_run(DAG_ID)
    events = airflow_services.api.get(
        f"/assets/events?source_dag_id={DAG_ID}&limit=1000")["asset_events"]
    runs = [event["source_run_id"] for event in events]
    assert [r for r in runs if r.startswith("__airflow_temporary_run_")] == []
    (published,) = [event for event in events if event["source_run_id"] == run_id]
    assert (published["uri"], published["extra"]["step"]) == (
        "ringflow://ringflow_tp_train/train", 4)


@pytest.mark.slow
def test_make_demo_keeps_its_runs_and_checkpoints_in_its_airflow_home(tmp_path, mark):
    """`make demo` on a home of its own (DEMO_HOME) with $HOME elsewhere: ringflow's folders
    are under the demo's home, none under ~/.ringflow; its run publishes the Asset event."""
    demo, user = tmp_path / "demo-home", tmp_path / "user"
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "RINGFLOW"))}
    conf = {"model": "mlp", "steps": 6, "log_every": 3, "tensor_parallel_degree": 1,
            "nproc_per_host": 1}
    venv = VENV_BIN.parent
    out = subprocess.run(
        ["make", "-s", "-o", f"{venv}/.installed", "demo", f"VENV={venv}",
         f"DEMO_HOME={demo}", f"DEMO_CONF={json.dumps(conf)}"], cwd=REPO, capture_output=True,
        text=True, timeout=400, env={**env, "HOME": str(user), "TP_TEST_MARK": mark})
    shown = out.stdout.splitlines()
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert not (user / ".ringflow").exists()
    folders = dict(re.findall(r"^(checkpoint|worker logs|loss plot|losses) +(/\S+)$",
                              out.stdout, re.M))
    ringflow = demo / "ringflow"
    assert folders["checkpoint"].startswith(f"{ringflow}/checkpoints/ringflow_tp_train/")
    for name in ("worker logs", "loss plot", "losses"):
        assert folders[name].startswith(f"{ringflow}/runs/ringflow_tp_train/"), shown
    assert all(Path(path).exists() for path in folders.values()), folders
    assert (ringflow / "jobs").is_dir()                  # the job's state (its supervisor)
    assert any(line.startswith("asset event ringflow://ringflow_tp_train/train {") and
               f"'checkpoint': '{folders['checkpoint']}'" in line for line in shown), shown
    # the evaluate DAG ran on that event: an MLP trained without validation data is skipped
    assert any(re.fullmatch(r"ringflow_tp_train_evaluate run manual__\S+: success \(task "
                            r"evaluate: skipped\)", line) for line in shown), shown


def write_dag(folder: Path, dag_id: str, retries: int, **model_args) -> Path:
    """A one-task DAG file running the test builder (tests/provider/tp_builders.py)."""
    path = folder / f"{dag_id}.py"
    path.write_text(textwrap.dedent(f"""
        from datetime import timedelta
        from airflow.sdk import DAG
        from ringflow_provider.operators.tp_train import TPTrainOperator

        with DAG(dag_id={dag_id!r}, schedule=None, catchup=False):
            TPTrainOperator(task_id="train", model="tests.provider.tp_builders:build",
                            model_args={model_args!r}, steps=40, log_every=4,
                            tensor_parallel_degree=2, checkpoint_every=8,
                            checkpoint_dir={str(folder / "ckpt")!r},
                            log_dir={str(folder / "logs")!r} + "/{{{{ ti.try_number }}}}",
                            extra_env={{"RF_TEST_TRY": "{{{{ ti.try_number }}}}",
                                       "PYTHONPATH": {str(REPO)!r}}},
                            allow_unsafe_env=True, retries={retries}, retry_delay=timedelta(0))
        """))
    return path


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_task_naming_the_rank(airflow_home, mark, tmp_path):
    dag_id = f"tp_fail_{mark[:8]}"
    dag_file = write_dag(tmp_path, dag_id, retries=0, fail_rank=1)
    out = airflow("dags", "test", dag_id, "-f", str(dag_file), mark=mark, dags_folder=tmp_path)
    log = out.stdout + out.stderr
    run_id, run_state = newest_run(dag_id)
    state, tries, summary, events = task_result(dag_id, run_id)
    assert (run_state, state, tries, summary, events) == ("failed", "failed", 1, None, [])
    where = f"training failed: rank 1 on host {socket.gethostname()} (pid "
    assert (where in log and "failed first with exit code 1: RuntimeError: rank 1 fails on "
            "purpose" in log), log[-4000:]
    assert "rank 1 fails on purpose while building the model" in log   # the log's tail


@pytest.mark.slow
def test_a_retry_resumes_from_the_checkpoint_the_failed_try_left(airflow_home, mark, tmp_path):
    dag_id = f"tp_retry_{mark[:8]}"
    manifest = tmp_path / "ckpt" / "step-00000008" / "manifest-host-0.json"
    dag_file = write_dag(tmp_path, dag_id, retries=1, die_on_first_try_after=str(manifest),
                         hidden_size=256)
    out = airflow("dags", "test", dag_id, "-f", str(dag_file), mark=mark, dags_folder=tmp_path)
    log = out.stdout + out.stderr
    run_id, run_state = newest_run(dag_id)
    state, tries, summary, _ = task_result(dag_id, run_id)
    assert (run_state, state, tries) == ("success", "success", 2), log[-4000:]
    assert "rank 1 dies on purpose after step-00000008" in (tmp_path / "logs" / "1" /
                                                            "workerlog.1").read_text()
    resumed = summary["resumed_from"]
    assert resumed in (8, 16, 24, 32)                  # the newest complete when rank 1 died
    assert f"try 2: resuming from step {resumed} (checkpoint {tmp_path}/ckpt/step-" in log
    # the first step a run trains is logged, then every log_every-th
    assert [s for s, _ in summary["loss_history"]] == [resumed + 1, *range(resumed + 4, 41, 4)]
    assert summary["steps"] == 40 and summary["log_dir"] == str(tmp_path / "logs" / "2")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_the_task_process_leaves_no_rank_and_no_segment(airflow_home, mark, sig):
    """SIGTERM: Airflow's handler runs on_kill and the task fails; SIGKILL: the launcher sees
    its stdin end and stops the ranks. Either way nothing is left (the `mark` fixture)."""
    conf = {"steps": 100000, "log_every": 1}
    proc = subprocess.Popen(
        [str(VENV_BIN / "airflow"), "tasks", "test", DAG_ID, "train", "-t", json.dumps(conf)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RINGFLOW_TEST_MARK": mark, "PYTHONPATH": str(REPO)})
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "step 3/100000" in line:
                break
        assert len(marked(mark)) >= 4, "".join(seen)[-3000:]  # CLI, launcher, 2 ranks
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    if sig == signal.SIGTERM:
        assert "was killed (on_kill); it was stopped on every host" in rest, rest[-3000:]
        assert task_states(rest) == ["up_for_retry"], rest[-3000:]   # retries=1, as Airflow does
    else:
        assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: not marked(mark), 15, "the launcher and the ranks to stop")
