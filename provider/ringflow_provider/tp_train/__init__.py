"""TPTrainOperator's parts without Airflow: the job spec at the boundary (`spec`), the
argument rules (`args`), and what the job's lines become (`report`); and `params`, the
trigger form's Params made from those rules (`form`; imports Airflow when called)."""

from __future__ import annotations

from typing import Any


def params(fields: Any) -> dict[str, Any]:
    """The trigger form's Params for TPTrainOperator arguments (`form.params`)."""
    from ringflow_provider.tp_train.form import params as made

    return made(fields)
