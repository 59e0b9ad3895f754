"""A trigger form for a DAG that runs TPTrainOperator: Airflow `Param`s whose JSON schema
(type, bounds, enum, pattern) is generated from the operator's own rules, the job spec's
pydantic model (`spec.TPTrainSpec`) and the other arguments' (`args.FormArgs`), so the form
cannot offer a value the operator refuses nor refuse one it takes.

A DAG chooses only how a param is shown (section, title, description, ...), its default and
a narrower choice (an ``enum`` or ``type`` subset), each checked against those rules: what
makes a value valid is never written twice. Rules across fields (the batch divisible by the
data-parallel degree, a host given twice) are the operator's alone: it refuses them when
the task starts, naming the field.

What reaches the hosts (which hosts, the connection, the interpreter) should be a choice the
DAG author allows, not free text: `variable_choices` reads those choices from an Airflow
Variable for an ``enum`` (any DAG may use it, for any operator's params).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from ringflow.errors import ConfigError
from ringflow.train import optim
from ringflow_provider.tp_train.args import FormArgs
from ringflow_provider.tp_train.spec import TPTrainSpec, parse_spec

#: what a DAG may say about a param: how it is shown
SHOWN = frozenset({"section", "title", "description", "description_md", "values_display",
                   "examples", "format"})
#: what a DAG may narrow (each value checked against the operator's rules)
NARROWED = frozenset({"enum", "type"})
#: the parts of the operator's `optimizer` argument a form may offer as params of their own
OPTIMIZER_PARTS = ("optimizer.type", "optimizer.learning_rate")
DEFAULT_LEARNING_RATE = 1e-3


def field_schema(name: str, types: str | list[str] | None = None) -> dict[str, Any]:
    """The JSON schema of operator argument `name` (a job-spec field, another argument of
    `FormArgs`, or one of OPTIMIZER_PARTS) as the operator's rules make it, with its
    ``default`` and ``description``; `types`: only these of its types (ValueError if one is
    not among them)."""
    if name == "optimizer.type":  # those a type and a learning rate build (lars: momentum)
        schema = {"type": "string", "default": "adam", "description": "the optimizer",
                  "enum": [kind for kind in optim.optimizer_classes() if _builds(kind)]}
    elif name == "optimizer.learning_rate":
        schema = {"type": "number", "minimum": optim.LEARNING_RATE_MINIMUM,
                  "default": DEFAULT_LEARNING_RATE,
                  "description": "the optimizer's learning rate"}
    else:
        schema = dict(_model_of(name).model_json_schema()["properties"][name])
    return _flat(name, schema, types)


def check_value(name: str, value: Any) -> None:
    """ValueError when the operator refuses `value` for argument `name` on its own (rules
    across fields aside)."""
    try:
        if name == "optimizer.type":
            optim.check_optimizer({"type": value, "learning_rate": DEFAULT_LEARNING_RATE})
        elif name == "optimizer.learning_rate":
            optim.check_optimizer({"type": "adam", "learning_rate": value})
        elif _model_of(name) is TPTrainSpec:
            parse_spec({name: value})  # the runtime's rules too (a model's name, ...)
        else:
            FormArgs.model_validate({name: value})
    except (ValidationError, ConfigError, ValueError) as exc:
        raise ValueError(f"{name}: the operator refuses {value!r}: {exc}") from None


def param_schemas(fields: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """param name -> its JSON schema with its default: the operator's rules for the argument
    it sets (``field``, default the param's name) with what `fields` says of it (SHOWN,
    NARROWED, ``default``). No Airflow needed; `params` makes the Params."""
    schemas = {}
    for param, said in fields.items():
        said = dict(said)
        name = said.pop("field", param)
        refused = sorted(set(said) - SHOWN - NARROWED - {"default"})
        if refused:
            raise ValueError(f"param {param!r}: {', '.join(refused)} come from the operator's "
                             f"rules for {name!r}, not from the DAG")
        schema = field_schema(name, said.pop("type", None))
        for value in said.get("enum", []):
            check_value(name, value)
        if "default" in said:
            check_value(name, said["default"])
        schemas[param] = {**schema, **said}
    return schemas


def params(fields: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The trigger form's Params (`airflow.sdk.Param`) for TPTrainOperator arguments:
    ``{param name: {"field": operator argument (default: the name), "section": ...,
    "description": ..., "default": ..., "enum": [...]}}``; see `param_schemas`."""
    from airflow.sdk import Param

    made = {}
    for param, schema in param_schemas(fields).items():
        schema = dict(schema)
        default = schema.pop("default", None)
        made[param] = Param(default, **schema)
    return made


def variable_choices(key: str, default: Sequence[Any] = ()) -> list[Any]:
    """The choices Airflow Variable `key` allows, for a param's ``enum``: a JSON list of
    values (strings, numbers, booleans, null); an item that is itself a list of strings (a
    host list) becomes its comma-separated text, as a ``hosts`` param takes it. Read when
    the DAG file is parsed (a change shows once the file is parsed again); `default` while
    the Variable is unset, so the DAG parses without it. ValueError naming the Variable when
    it holds anything else (the DAG then fails to import, saying so).

    ``airflow variables set ringflow_tp_train_hosts '["trainer-a,trainer-b", ["c1", "c2"]]'``
    """
    from airflow.sdk import Variable

    raw = Variable.get(key, default=None)
    if raw is None:
        return list(default)
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = raw
    if not isinstance(value, list):
        raise ValueError(f"Airflow Variable {key!r} must hold a JSON list of the choices a "
                         f"trigger form may offer, got {raw!r}")
    choices = []
    for item in value:
        if isinstance(item, list) and item and all(isinstance(h, str) for h in item):
            item = ",".join(h.strip() for h in item)
        elif item is not None and not isinstance(item, (str, int, float, bool)):
            raise ValueError(f"Airflow Variable {key!r}: {item!r} is not a choice (a string, "
                             f"number, boolean, null or a list of host names)")
        choices.append(item)
    return choices


def _builds(kind: str) -> bool:
    try:
        optim.check_optimizer({"type": kind, "learning_rate": DEFAULT_LEARNING_RATE})
    except ConfigError:
        return False
    return True


def _model_of(name: str) -> type[BaseModel]:
    for model in (TPTrainSpec, FormArgs):
        if name in model.model_fields:
            return model
    raise ValueError(f"{name!r} is not an argument of TPTrainOperator a form can set "
                     f"(job-spec fields, {', '.join(FormArgs.model_fields)}, "
                     f"{', '.join(OPTIMIZER_PARTS)})")


def _flat(name: str, schema: dict[str, Any], types: str | list[str] | None
          ) -> dict[str, Any]:
    """Pydantic's schema of one field as Airflow's form reads it: no title, and a type list
    (``["null", "string"]``) for its ``anyOf`` of one-type branches; only the branches of
    `types` when given."""
    schema.pop("title", None)
    branches = schema.pop("anyOf", None) or [{"type": schema.pop("type")}]
    if types is not None:
        asked = [types] if isinstance(types, str) else list(types)
        known = [b["type"] for b in branches]
        if not set(asked) <= set(known):
            raise ValueError(f"{name}: type {types!r} is wider than the operator's {known!r}")
        branches = [b for b in branches if b["type"] in asked]
    for branch in branches:
        schema.update({k: v for k, v in branch.items() if k != "type"})
    found = sorted((b["type"] for b in branches), key=lambda t: (t != "null", t))
    schema["type"] = found[0] if len(found) == 1 else found
    return schema
