"""Jobs that outlive the task, against real Airflow services (api-server, scheduler with the
LocalExecutor, dag-processor, triggerer; SQLite): the example TP DAG deferred to the
triggerer, marked failed while deferred, watched across a triggerer that is SIGKILLed and
replaced, and retried after its task process was SIGKILLed (attaching to the running job,
or restarting it from a checkpoint)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from ringflow_provider.launchers.job import TaskKey
from tests import procs
from tests.provider.conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.airflow, pytest.mark.slow, pytest.mark.multiproc]

DAG, TASK = "ringflow_tp_train", "train"
STEP = re.compile(r"^step (\d+)/(\d+) ")


def job_processes(run_id: str) -> list[int]:
    """Every process of the run's training jobs (supervisors, agents, ranks): they carry the
    task's key in RINGFLOW_TASK."""
    return procs.marked_processes("RINGFLOW_TASK", TaskKey(DAG, TASK, run_id, 1).key)


def steps_logged(api, run_id: str, try_number: int = 1) -> list[int]:
    return [int(m.group(1)) for line in api.task_log(DAG, run_id, TASK, try_number)
            if (m := STEP.match(line))]


def ui_metrics(services, run_id: str) -> dict:
    """The training views' data of the run's task (GET /ringflow/api/metrics/...)."""
    return services.api.get(f"{services.base_url}/ringflow/api/metrics/{DAG}/"
                            f"{quote(run_id, safe='')}/{TASK}")


def shm_of(job_id: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"ringflow-{job_id}-")]


def test_a_deferred_job_holds_no_worker_slot_and_reports_as_an_attached_one(
        airflow_services):
    api = airflow_services.api
    conf = {"steps": 60, "log_every": 5, "seed": 5}
    attached = api.trigger_form(DAG, **conf)
    api.wait_for_run(DAG, attached, timeout=180)
    deferred = api.trigger_form(DAG, deferrable=True, poll_interval=1, **conf)
    api.wait_for_state(DAG, deferred, TASK, {"deferred"}, timeout=120)
    # no slot of the pool (what the executor runs tasks in) is ours while deferred; other
    # tasks (the evaluate DAG, run by the attached run's Asset event) may hold one
    running = api.get("/dags/~/dagRuns/~/taskInstances?state=running")["task_instances"]
    pool = api.pool()
    assert pool["running_slots"] == len(running), (pool, running)
    assert not [t for t in running if (t["dag_id"], t["dag_run_id"]) == (DAG, deferred)]
    assert pool["deferred_slots"] == 1, pool
    assert job_processes(deferred), "nothing trains while the task is deferred"
    api.wait_for_run(DAG, deferred, timeout=180)
    want, got = (api.xcom(DAG, run, TASK) for run in (attached, deferred))
    assert got["loss_history"] == want["loss_history"]           # bitwise: same floats
    assert [s for s, _ in got["loss_history"]] == [1, *range(5, 61, 5)]
    assert {k: got[k] for k in ("final_loss", "steps", "world_size", "resumed_from")} == \
        {k: want[k] for k in ("final_loss", "steps", "world_size", "resumed_from")}
    job = api.xcom(DAG, deferred, TASK, key="ringflow_job")
    assert job["launcher"] == "local" and job["task"]["run_id"] == deferred
    log = api.task_log(DAG, deferred, TASK, 1)
    assert any(line.startswith("deferring: the triggerer watches job ") for line in log)
    assert steps_logged(api, deferred) == [1, *range(5, 61, 5)]   # through the triggerer
    # the triggerer's progress records carry the numbers as fields, as the task's do
    (watched,) = ui_metrics(airflow_services, deferred)["tries"]
    assert [[p["step"], p["loss"]] for p in watched["points"]] == got["loss_history"]
    assert any(line.startswith("training finished") for line in log)
    assert not job_processes(deferred)


def test_marking_a_deferred_task_failed_stops_its_job_within_10_s(airflow_services):
    api = airflow_services.api
    run = api.trigger_form(DAG, deferrable=True, poll_interval=1, steps=100000, log_every=50)
    api.wait_for_state(DAG, run, TASK, {"deferred"}, timeout=120)
    wait_until(lambda: len(job_processes(run)) >= 4, 60, "the supervisor, agent and 2 ranks")
    # a trigger that no triggerer has taken up yet cannot be told of the mark (Airflow deletes
    # it unseen; the job then ends when its lease runs out): mark once the watch is on
    wait_until(lambda: any(line.startswith("the triggerer watches job ")
                           for line in api.task_log(DAG, run, TASK, 1)), 60, "the watch")
    job = api.xcom(DAG, run, TASK, key="ringflow_job")
    api.set_task_state(DAG, run, TASK, "failed")
    marked = time.monotonic()
    try:
        wait_until(lambda: not job_processes(run), 10, "every process of the job to end")
    except AssertionError as exc:
        log = "\n".join(api.task_log(DAG, run, TASK, 1)[-30:])
        raise AssertionError(f"{exc}; the task's log ends:\n{log}") from None
    assert time.monotonic() - marked < 10
    assert shm_of(job["job_id"]) == []
    status = (Path(job["parts"][0]["job_dir"]) / "status.json").read_text()
    assert '"stopped_by": "request"' in status and "marked failed or cleared" in status


def test_a_job_goes_on_when_its_triggerer_is_killed_and_another_takes_over(airflow_services):
    api = airflow_services.api
    steps = 400
    run = api.trigger_form(DAG, deferrable=True, poll_interval=1, steps=steps, log_every=10)
    api.wait_for_state(DAG, run, TASK, {"deferred"}, timeout=120)
    wait_until(lambda: len(steps_logged(api, run)) >= 3, 90, "the triggerer to log steps")
    airflow_services.kill_service("triggerer")
    airflow_services.start_service("triggerer")
    api.wait_for_run(DAG, run, timeout=240)
    assert steps_logged(api, run) == [1, *range(10, steps + 1, 10)]  # none twice, none lost
    assert api.xcom(DAG, run, TASK)["steps"] == steps


def task_process_of(run_id: str) -> int:
    """The task process watching the run's job: the parent of the shell that runs the
    job's follower (`ringflow.launch.supervisor follow`)."""
    key = TaskKey(DAG, TASK, run_id, 1).key
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"follow" in cmdline and any(key.encode() in part for part in cmdline):
            pid = int(entry.name)
            while (parent := _ppid(pid)) and _comm(parent) in ("sh", "dash"):
                pid = parent
            return _ppid(pid)
    raise AssertionError(f"no follower of run {run_id}'s job")


def try_log(api, run_id: str, try_number: int) -> list[str]:
    """The try's log, empty while the try has none yet."""
    try:
        return api.task_log(DAG, run_id, TASK, try_number)
    except AssertionError:
        return []


def rank_process(pid: int) -> bool:
    try:
        return b"PADDLE_TRAINER_ID=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@pytest.mark.parametrize("on_existing", ["reattach", "restart"])
def test_a_retry_after_the_task_process_was_killed_attaches_or_restarts(airflow_services,
                                                                        on_existing, request):
    api = airflow_services.api
    steps = 300
    run = api.trigger_form(DAG, steps=steps, log_every=10, on_existing=on_existing)
    api.wait_for_state(DAG, run, TASK, {"running"}, timeout=120)
    wait_until(lambda: len(steps_logged(api, run)) >= 13, 120, "training past step 120")
    # the ranks paused while try 2 starts: a fast machine would otherwise finish the job
    # before try 2 finds it (a stop continues paused ranks before it signals them)
    ranks = [pid for pid in job_processes(run) if rank_process(pid)]
    assert len(ranks) == 2, ranks
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        os.kill(task_process_of(run), signal.SIGKILL)
        if on_existing == "reattach":
            found = "try 2: attaching"
            try:
                wait_until(lambda: any(found in line for line in try_log(api, run, 2)), 180,
                           f"try 2's log to say {found!r}", step=0.5)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; try 2's log ends:\n" +
                                     "\n".join(try_log(api, run, 2)[-30:])) from None
        else:  # the job is tied to its watcher: it stops itself, paused ranks too
            wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), 30,
                       "try 1's job to stop with its task process", step=0.2)
    finally:
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    api.wait_for_run(DAG, run, timeout=240)
    ti = api.task_instance(DAG, run, TASK)
    assert ti["try_number"] == 2
    summary = api.xcom(DAG, run, TASK)
    log = api.task_log(DAG, run, TASK, 2)
    if on_existing == "reattach":
        assert any(re.fullmatch(rf"try 2: attaching to the running job of try 1 at step "
                                rf"\d+/{steps}", line) for line in log), log[-20:]
        assert [s for s, _ in summary["loss_history"]] == [1, *range(10, steps + 1, 10)]
        assert summary["resumed_from"] is None
    else:
        resumed = summary["resumed_from"]
        assert resumed is not None and resumed >= 100
        assert any(line.startswith(f"try 2: resuming from step {resumed}") for line in log)
        assert summary["loss_history"][0][0] > resumed
    assert not job_processes(run)
    # the training views: both tries, try 2 going on where try 1's job was (re-attached) or
    # from the checkpoint it resumed from (restarted)
    first, second = ui_metrics(airflow_services, run)["tries"]
    assert (first["try_number"], second["try_number"], second["state"]) == (1, 2, "success")
    assert first["points"][-1]["step"] >= 120
    assert second["resumed_from"] == summary["resumed_from"]
    second_steps = [p["step"] for p in second["points"]]
    assert second_steps == [s for s, _ in summary["loss_history"] if s >= second_steps[0]]
    if on_existing == "restart":
        assert first["points"][0]["step"] == 1 and second_steps[0] > summary["resumed_from"]
        page = request.getfixturevalue("airflow_ui")
        page.goto(f"{airflow_services.base_url}/dags/{DAG}/runs/{quote(run, safe='')}/tasks/"
                  f"{TASK}/plugin/training")
        frame = page.frame_locator("iframe[src*='/ringflow/']")
        frame.locator("#loss-chart path.join").wait_for(state="attached")  # try 1 -> try 2
        assert frame.locator("#loss-chart path.series").evaluate_all(
            "paths => paths.map(p => p.dataset.series)") == ["try 1", "try 2"]
        assert frame.locator("#loss-chart g.resume").text_content() == \
            f"try 2 resumes at step {summary['resumed_from']}"
