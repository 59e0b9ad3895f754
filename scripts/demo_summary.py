"""The end of `make demo`: the newest run of a DAG in the demo's Airflow home, read from
Airflow's metadata database: its state, the training task's summary (its XCom) and the
event it emitted on its Asset.

    AIRFLOW_HOME=.airflow python scripts/demo_summary.py [dag_id] [task_id]
"""

from __future__ import annotations

import sys

from sqlalchemy import select


def main(argv: list[str]) -> int:
    dag_id = argv[0] if argv else "ringflow_tp_train"
    task_id = argv[1] if len(argv) > 1 else "train"
    from airflow.models.asset import AssetEvent
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)
                              .order_by(DagRun.id.desc()).limit(1)).first()
        if run is None:
            print(f"no run of {dag_id} in this Airflow home", file=sys.stderr)
            return 1
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_id, XComModel.run_id == run.run_id,
            XComModel.task_id == task_id, XComModel.key == "return_value")).first()
        summary = XComModel.deserialize_value(row) if row is not None else None
        event = session.scalars(select(AssetEvent).where(
            AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run.run_id)
            .order_by(AssetEvent.id.desc()).limit(1)).first()
        event_extra = dict(event.extra) if event is not None else None
        event_uri = event.asset.uri if event is not None and event.asset else ""
        state = str(run.state)
    print(f"\n{dag_id} run {run.run_id}: {state}")
    if not summary:
        print(f"(task {task_id} returned no summary)")
        return 0 if state == "success" else 1
    history = summary["loss_history"]
    if history:
        print(f"loss {history[0][1]:.4f} at step {history[0][0]} -> {summary['final_loss']:.4f} "
              f"at step {summary['steps']}  ({summary['world_size']} ranks: tensor parallel "
              f"{summary['mp_degree']} x data parallel {summary['dp_degree']}, "
              f"{summary['samples_per_s']:,.0f} samples/s)")
    print(f"checkpoint  {summary['checkpoint']}")
    print(f"worker logs {summary['log_dir']}")
    print(f"loss plot   {summary['plot'] or '(none: see the task log)'}")
    if event_extra is not None:
        print(f"asset event {event_uri} {event_extra}")
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
