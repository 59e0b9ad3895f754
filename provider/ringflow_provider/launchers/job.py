"""What identifies a launched job, as plain data that travels as JSON (the `ringflow_job`
XCom, a trigger's arguments, `handle.json` in each job folder): the task try it belongs to,
its parts (one supervised command per host that has one) and where its files are."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

#: what a new try does when the previous try's job still runs (`on_existing`)
ON_EXISTING = ("reattach", "restart")


@dataclass(frozen=True)
class TaskKey:
    """One Airflow task try (of one mapped instance: `map_index` >= 0)."""

    dag_id: str
    task_id: str
    run_id: str
    try_number: int
    map_index: int = -1

    @classmethod
    def from_ti(cls, ti: Any) -> TaskKey:
        """`airflow tasks test` runs a task as try 0: a person counts it as try 1."""
        map_index = getattr(ti, "map_index", -1)
        return cls(ti.dag_id, ti.task_id, ti.run_id, max(int(ti.try_number or 0), 1),
                   -1 if map_index is None else int(map_index))

    @property
    def key(self) -> str:
        """The task's (not the try's) name in folders: every try of it shares one; each
        mapped instance has its own."""
        parts = (self.dag_id, self.task_id, self.run_id)
        if self.map_index >= 0:
            parts += (str(self.map_index),)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]

    @property
    def instance(self) -> str:
        """The task id, with the map index of a mapped instance: `train` or `train[3]`."""
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"

    def __str__(self) -> str:
        return f"{self.dag_id}/{self.instance}/{self.run_id}/try{self.try_number}"


@dataclass(frozen=True)
class Part:
    """One supervised command of a job: on `host`, in `job_dir` (absolute, or relative to
    the SSH login's home), reached through `conn_id` (None: this host, no SSH)."""

    host: str
    job_dir: str
    conn_id: str | None = None


@dataclass(frozen=True)
class JobHandle:
    """Everything a watcher needs to follow, stop or report a job (no secret)."""

    launcher: str
    job_id: str
    task: TaskKey
    hosts: tuple[str, ...]           # every host of the job, in rank order
    parts: tuple[Part, ...]
    python: str                      # the interpreter the parts' hosts run ringflow with
    pythonpath: str | None = None    # where the runtime is there (None: installed)
    gathered: bool = False           # one part gathers every host's lines (mpirun's tags)
    show_hosts: bool = True          # the task log tags lines with their host
    log_dir: str | None = None
    checkpoint_dir: str | None = None
    lease_timeout: float | None = None
    started_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        value = asdict(self)
        value["hosts"], value["parts"] = list(self.hosts), [asdict(p) for p in self.parts]
        return value

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> JobHandle:
        value = dict(value)
        value["task"] = TaskKey(**value["task"])
        value["hosts"] = tuple(value["hosts"])
        value["parts"] = tuple(Part(**p) for p in value["parts"])
        return cls(**value)

    @property
    def try_number(self) -> int:
        return self.task.try_number
