"""The task instance an operator's `execute()` gets when a test calls it in-process, with
what the operators use of Airflow's RuntimeTaskInstance (ids, map index, try number, tries allowed,
`xcom_push`). The real one exists only inside a task run; test_airflow_cli.py,
test_tp_train_airflow.py and tests/e2e run the operators through real Airflow."""

from __future__ import annotations

import uuid
from typing import Any


class TaskInstanceStub:
    def __init__(self, dag_id: str, task_id: str, run_id: str | None = None,
                 try_number: int = 1, max_tries: int = 0, map_index: int = -1) -> None:
        self.dag_id, self.task_id, self.map_index = dag_id, task_id, map_index
        self.run_id = run_id or f"run-{uuid.uuid4().hex[:8]}"
        self.try_number, self.max_tries = try_number, max_tries
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value
