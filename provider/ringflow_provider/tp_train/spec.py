"""TPTrainOperator's job spec at the Airflow boundary: the pydantic model built from the
runtime's ``ringflow.train.spec.JobSpec`` (so the two cannot disagree), and the ids a task's
folders are named after."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, create_model

from ringflow.errors import ConfigError, did_you_mean
from ringflow.train.spec import FIELD_DOCS, FIELD_MAXIMUMS, FIELD_MINIMUMS, JobSpec
from ringflow_provider.rendered import json_text, none_text

SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))
_DICT_FIELDS = {"model_args", "optimizer", "lr_schedule"}
_LIST_FIELDS = {"recompute"}    # true/false, or a list that may arrive as JSON text
_OPTIONAL = {"lr_schedule", "grad_clip", "checkpoint_dir", "eval_data"}


def _field(f: dataclasses.Field) -> tuple[Any, Any]:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    before = []
    if f.name in _OPTIONAL:
        before.append(BeforeValidator(none_text))
    if f.name in _DICT_FIELDS | _LIST_FIELDS:
        before.append(BeforeValidator(lambda v, name=f.name: json_text(v, name)))
    extra = {"ge": FIELD_MINIMUMS[f.name]} if f.name in FIELD_MINIMUMS else {}
    if f.name in FIELD_MAXIMUMS:
        extra["le"] = FIELD_MAXIMUMS[f.name]
    annotated = Annotated[(f.type, *before)] if before else f.type
    return annotated, Field(default, description=FIELD_DOCS[f.name], **extra)


#: the job spec at the Airflow boundary: pydantic (extra="forbid") over JobSpec's fields,
#: with lax coercion of what templates render ("200" -> 200, JSON text -> dict)
TPTrainSpec = create_model("TPTrainSpec", __config__=ConfigDict(extra="forbid"),
                           **{f.name: _field(f) for f in dataclasses.fields(JobSpec)})


def parse_spec(values: Mapping[str, Any]) -> JobSpec:
    """The rendered operator arguments as a JobSpec; a ValueError names the field and the
    value (pydantic's checks, then the runtime's own rules, the same messages a host gives)."""
    try:
        model = TPTrainSpec(**values)
    except ValidationError as exc:
        raise ValueError(_pydantic_message(exc)) from None
    try:
        return JobSpec.from_dict(model.model_dump())
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        hint = did_you_mean(where, SPEC_FIELDS) if err["type"] == "extra_forbidden" else ""
        parts.append(f"{where}: {err['msg']}{hint} (got {err.get('input')!r})")
    return "; ".join(parts)


_UNSAFE_PATH = re.compile(r"[^A-Za-z0-9._+=@-]")


def task_folder(task_id: str, map_index: int = -1) -> str:
    """A task's folder under a run's: `train`, or `train/map-3` for a mapped instance."""
    return path_part(task_id) + (f"/map-{map_index}" if map_index >= 0 else "")


def path_part(text: str) -> str:
    """A dag, run or task id as one path component (run ids hold ':' and '+')."""
    cleaned = _UNSAFE_PATH.sub("_", text).strip(".")
    return cleaned or "_"
