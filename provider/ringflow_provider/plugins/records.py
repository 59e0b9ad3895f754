"""What a training task's log records say, without Airflow: the progress points (the fields
`launchers.lines.log_fields` puts on a metric line's record), where a try resumed and why it
failed. Records are the dicts Airflow's log reader returns, one per logged event."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ringflow_provider.launchers.lines import LOG_FIELDS

#: the record field of the line that says a try resumes from a checkpoint (TPTrainOperator)
RESUME_FIELD = "resume_step"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def progress_point(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A progress record's numbers (``{"step": 40, "loss": 0.41, "lr": 0.001,
    "samples_per_s": 1850.0}``, those it has), or None for any other record."""
    step, loss = record.get("step"), _number(record.get("loss"))
    if isinstance(step, bool) or not isinstance(step, int) or loss is None:
        return None
    point: dict[str, Any] = {"step": step, "loss": loss}
    for name in LOG_FIELDS[2:]:
        value = _number(record.get(name))
        if value is not None:
            point[name] = value
    return point


def progress_points(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The try's points by step; a step logged twice (a watch that read a line again) once,
    as it was last logged."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:
        point = progress_point(record)
        if point is not None:
            by_step[point["step"]] = point
    return [by_step[step] for step in sorted(by_step)]


def resume_step(records: Iterable[Mapping[str, Any]]) -> int | None:
    """The checkpoint step the try resumed from, if it said so."""
    for record in records:
        step = record.get(RESUME_FIELD)
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def failure(records: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the try failed: the last exception its log recorded (``Type: message``; of a
    chained one the exception raised, which comes first in the record's chain)."""
    found = None
    for record in records:
        errors = [e for e in record.get("error_detail") or []
                  if isinstance(e, Mapping) and e.get("exc_type")]
        if errors:
            found = f"{errors[0]['exc_type']}: {errors[0].get('exc_value') or ''}".rstrip(": ")
    return found
