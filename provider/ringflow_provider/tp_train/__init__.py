"""TPTrainOperator's parts without Airflow: the job spec at the boundary (`spec`), the
argument rules (`args`), the job's plan made by them (`plan`), and what the job's lines
become (`report`); and `params`, the trigger form's Params made from those rules (`form`;
imports Airflow when called), and `variable_choices`, the choices a DAG author allows in an
Airflow Variable."""

from __future__ import annotations

from typing import Any


def params(fields: Any) -> dict[str, Any]:
    """The trigger form's Params for TPTrainOperator arguments (`form.params`)."""
    from ringflow_provider.tp_train.form import params as made

    return made(fields)


def variable_choices(key: str, default: Any = ()) -> list[Any]:
    """The choices Airflow Variable `key` allows, for a param's ``enum``
    (`form.variable_choices`)."""
    from ringflow_provider.tp_train.form import variable_choices as read

    return read(key, default)
