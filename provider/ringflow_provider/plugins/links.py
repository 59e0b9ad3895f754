"""TPTrainOperator's "Training curve" extra link: the task instance's "Training" tab in the
Airflow UI. Imports only the task SDK, so a worker without the api-server's parts runs the
task all the same."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink, conf

#: the tab's route in the UI (`external_views` of the plugin: url_route)
TASK_ROUTE = "training"
DAG_ROUTE = "training-runs"


def ui_root() -> str:
    """The UI's root as users reach it (``[api] base_url``), without the trailing slash;
    empty when not set (links are then relative to the UI's host)."""
    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def task_tab_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1,
                 root: str | None = None) -> str:
    """The UI's address of a task instance's "Training" tab."""
    root = ui_root() if root is None else root
    path = (f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/"
            f"{quote(task_id, safe='')}")
    if map_index >= 0:
        path += f"/mapped/{map_index}"
    return f"{root}{path}/plugin/{TASK_ROUTE}"


class TrainingCurveLink(BaseOperatorLink):
    """Opens the task instance's "Training" tab: its loss curve, each try, the summary."""

    name = "Training curve"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return task_tab_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id,
                            getattr(ti_key, "map_index", -1))
