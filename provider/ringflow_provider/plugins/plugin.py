"""The Airflow plugin (entry point ``airflow.plugins``): the ``/ringflow`` app and the two
tabs the UI shows as pages of it. The app (FastAPI, Airflow's api-server parts) is built only
when the api-server asks for it, so loading the plugin elsewhere (a worker, the scheduler)
imports nothing beyond Airflow's plugin base."""

from __future__ import annotations

from functools import cached_property
from typing import Any
from urllib.parse import urlparse

from airflow.plugins_manager import AirflowPlugin

from ringflow_provider.plugins.links import DAG_ROUTE, TASK_ROUTE

PREFIX = "/ringflow"


def _base_path() -> str:
    """The path Airflow is served under (``[api] base_url``'s), empty at the root."""
    from airflow.configuration import conf

    return urlparse(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


class RingflowPlugin(AirflowPlugin):
    name = "ringflow"

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from ringflow_provider.plugins.app import create_app

        return [{"app": create_app(), "url_prefix": PREFIX, "name": "ringflow training"}]

    @cached_property
    def external_views(self) -> list[dict[str, Any]]:  # type: ignore[override]
        # the UI fills in {DAG_ID}, {RUN_ID}, {TASK_ID}, {MAP_INDEX} of the page it is on
        app = f"{_base_path()}{PREFIX}"
        return [
            {"name": "Training", "destination": "task_instance", "url_route": TASK_ROUTE,
             "href": f"{app}/task?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}"
                     f"&map_index={{MAP_INDEX}}"},
            {"name": "Training runs", "destination": "dag", "url_route": DAG_ROUTE,
             "href": f"{app}/dag?dag_id={{DAG_ID}}"},
        ]
