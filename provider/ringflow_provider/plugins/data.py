"""What the training views draw, read only from what Airflow keeps: every try's task log,
through Airflow's own log reader (as the UI's log view reads it, so it works wherever the
logs are: local files, served by workers, remote storage), and the task's XComs. No file on
a worker's disk is read. Runs in the api-server."""

from __future__ import annotations

import json
from typing import Any

from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.taskinstancehistory import TaskInstanceHistory
from airflow.models.xcom import XComModel
from airflow.utils.log.log_reader import TaskLogReader
from sqlalchemy import select
from sqlalchemy.orm import Session

from ringflow_provider.plugins import records

OPERATOR = "TPTrainOperator"  # the task type Airflow records for the operator's tasks
#: summary keys not repeated in the metrics answer (the points are there)
_NOT_SUMMARY = ("loss_history",)
#: try states whose log has no failure to show
_NOT_FAILED = {"success", "running", "deferred", "queued", "scheduled", "restarting", None}


class NotFound(LookupError):
    """A DAG, run or task instance that does not exist (the endpoints answer 404)."""


def _log_records(ti: TaskInstance | TaskInstanceHistory, try_number: int
                 ) -> list[dict[str, Any]]:
    """One try's whole log as dicts, as the REST API's log endpoint reads it."""
    reader = TaskLogReader()
    if not reader.supports_read:
        return []
    stream, _ = reader.read_log_chunks(ti, try_number, {"download_logs": True})
    return [r.model_dump(mode="json") if hasattr(r, "model_dump") else dict(r)
            for r in stream if hasattr(r, "model_dump") or isinstance(r, dict)]


def _xcom(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int,
          key: str = "return_value") -> Any:
    row = session.scalars(XComModel.get_many(run_id=run_id, key=key, task_ids=task_id,
                                             dag_ids=dag_id, map_indexes=map_index,
                                             limit=1)).first()
    if row is None:
        return None
    value = row.value
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _tries(session: Session, ti: TaskInstance) -> list[TaskInstance | TaskInstanceHistory]:
    """Every try of the task instance that started, oldest first (earlier tries are kept
    in Airflow's task instance history)."""
    earlier = session.scalars(
        select(TaskInstanceHistory).where(
            TaskInstanceHistory.dag_id == ti.dag_id, TaskInstanceHistory.run_id == ti.run_id,
            TaskInstanceHistory.task_id == ti.task_id,
            TaskInstanceHistory.map_index == ti.map_index,
            TaskInstanceHistory.try_number < ti.try_number,
        ).order_by(TaskInstanceHistory.try_number)).all()
    return [*earlier, ti] if ti.try_number else list(earlier)


def metrics(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int = -1
            ) -> dict[str, Any]:
    """``{"tries": [{"try_number", "state", "points": [...], "resumed_from", "failure"}],
    "summary": {...} | None, "state": ...}`` of one task instance (NotFound if none)."""
    ti = session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
        TaskInstance.task_id == task_id, TaskInstance.map_index == map_index)).first()
    if ti is None:
        if session.scalars(select(DagRun.id).where(DagRun.dag_id == dag_id,
                                                   DagRun.run_id == run_id)).first() is None:
            raise NotFound(f"DAG {dag_id!r} has no run {run_id!r}")
        raise NotFound(f"run {run_id!r} of DAG {dag_id!r} has no task {task_id!r}"
                       + (f" with map index {map_index}" if map_index >= 0 else ""))
    tries = []
    for attempt in _tries(session, ti):
        logged = _log_records(attempt, attempt.try_number)
        state = attempt.state.value if hasattr(attempt.state, "value") else attempt.state
        tries.append({"try_number": attempt.try_number, "state": state,
                      "points": records.progress_points(logged),
                      "resumed_from": records.resume_step(logged),
                      "failure": None if state in _NOT_FAILED else records.failure(logged),
                      "hostname": attempt.hostname or None})
    summary = _xcom(session, dag_id, run_id, task_id, map_index)
    if isinstance(summary, dict):
        summary = {k: v for k, v in summary.items() if k not in _NOT_SUMMARY}
    else:
        summary = None
    state = ti.state.value if hasattr(ti.state, "value") else ti.state
    return {"tries": tries, "summary": summary, "state": state, "operator": ti.operator}


def _seconds(run: DagRun) -> float | None:
    if run.start_date is None or run.end_date is None:
        return None
    return round((run.end_date - run.start_date).total_seconds(), 3)


def runs(session: Session, dag_id: str, limit: int = 10) -> dict[str, Any]:
    """The DAG's newest runs (at most `limit`), each with its conf, state and its first
    TPTrainOperator task's final loss, samples/s and loss history (from that task's XCom,
    once it ended). NotFound for a DAG Airflow does not know."""
    if session.scalars(select(DagModel.dag_id).where(DagModel.dag_id == dag_id)).first() \
            is None:
        raise NotFound(f"no DAG {dag_id!r}")
    found = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)
                            .order_by(DagRun.run_after.desc(), DagRun.id.desc())
                            .limit(limit)).all()
    answer = []
    for run in found:
        ti = session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id,
            TaskInstance.operator == OPERATOR).order_by(TaskInstance.task_id,
                                                        TaskInstance.map_index)).first()
        summary = _xcom(session, dag_id, run.run_id, ti.task_id, ti.map_index) if ti else None
        summary = summary if isinstance(summary, dict) else {}
        state = run.state.value if hasattr(run.state, "value") else run.state
        answer.append({
            "run_id": run.run_id, "conf": run.conf or {}, "state": state,
            "final_loss": summary.get("final_loss"),
            "samples_per_s": summary.get("samples_per_s"),
            "duration_s": _seconds(run),
            "task_id": ti.task_id if ti else None,
            "map_index": ti.map_index if ti else None,
            "task_state": (ti.state.value if hasattr(ti.state, "value") else ti.state)
            if ti else None,
            "loss_history": summary.get("loss_history"),
            "run_after": run.run_after.isoformat() if run.run_after else None,
        })
    return {"runs": answer}
