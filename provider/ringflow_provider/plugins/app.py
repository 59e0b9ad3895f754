"""The FastAPI app the api-server mounts at ``/ringflow``: the training pages (static HTML,
JavaScript and CSS from this package, charts drawn as SVG by the page: nothing from the
network) and their data endpoints, which take Airflow's own authentication and DAG access
checks (the REST API's) and answer 404 for what does not exist.

    GET /ringflow/api/metrics/{dag_id}/{run_id}/{task_id}?map_index=-1
    GET /ringflow/api/runs/{dag_id}?limit=10
    GET /ringflow/task?dag_id=..&run_id=..&task_id=..   the task instance's "Training" tab
    GET /ringflow/dag?dag_id=..                         the DAG's "Training runs" tab
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from ringflow_provider.plugins import data

STATIC = Path(__file__).parent / "static"
# Airflow's own rules: dag and task ids are letters, digits, '_', '.', '-' (at most 250); a
# run id is any printable text up to 250 characters (the scheduler's pattern is configurable)
ID_PATTERN = r"^[A-Za-z0-9_.\-]{1,250}$"
RUN_ID_PATTERN = r"^[^\x00-\x1f\x7f]{1,250}$"
MAX_RUNS = 100

DagId = Annotated[str, PathParam(pattern=ID_PATTERN)]
TaskId = Annotated[str, PathParam(pattern=ID_PATTERN)]
RunId = Annotated[str, PathParam(pattern=RUN_ID_PATTERN)]


def _read(*entities: DagAccessEntity) -> list[Any]:
    return [Depends(requires_access_dag("GET", entity)) for entity in entities]


def create_app() -> FastAPI:
    app = FastAPI(title="ringflow training views", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")

    @app.get("/api/metrics/{dag_id}/{run_id}/{task_id}",
             dependencies=_read(DagAccessEntity.TASK_INSTANCE, DagAccessEntity.TASK_LOGS,
                                DagAccessEntity.XCOM))
    def get_metrics(dag_id: DagId, run_id: RunId, task_id: TaskId, session: SessionDep,
                    map_index: Annotated[int, Query(ge=-1)] = -1) -> dict[str, Any]:
        """Every try's progress points (from its log records) and the summary (the task's
        XCom, once it succeeded)."""
        try:
            return data.metrics(session, dag_id, run_id, task_id, map_index)
        except data.NotFound as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/api/runs/{dag_id}",
             dependencies=_read(DagAccessEntity.RUN, DagAccessEntity.XCOM))
    def get_runs(dag_id: DagId, session: SessionDep,
                 limit: Annotated[int, Query(ge=1, le=MAX_RUNS)] = 10) -> dict[str, Any]:
        """The newest runs with their conf and their training task's results."""
        try:
            return data.runs(session, dag_id, limit)
        except data.NotFound as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/task", include_in_schema=False)
    def task_page() -> FileResponse:
        return FileResponse(STATIC / "task.html", headers={"Cache-Control": "no-cache"})

    @app.get("/dag", include_in_schema=False)
    def dag_page() -> FileResponse:
        return FileResponse(STATIC / "dag.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
