"""Training jobs on the runtime (issue 8): a ``JobSpec`` (spec.py), the worker loop
(worker.py, ``python -m ringflow.train SPEC.json``), data (data.py), checkpoints
(checkpoint.py) and the metric lines with their parser (metrics.py). Names load lazily,
so the Airflow provider can import the spec and the parser without the runtime."""

from __future__ import annotations

from .._lazy import Exports, lazy_exports

_EXPORTS: Exports = {
    "JobSpec": ("ringflow.train.spec", "JobSpec"),
    "FIELD_DOCS": ("ringflow.train.spec", "FIELD_DOCS"),
    "FIELD_MINIMUMS": ("ringflow.train.spec", "FIELD_MINIMUMS"),
    "parse_train_line": ("ringflow.train.metrics", "parse_train_line"),
    "format_line": ("ringflow.train.metrics", "format_line"),
    "latest_checkpoint": ("ringflow.train.checkpoint", "latest_checkpoint"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("ringflow.train", globals(), _EXPORTS)
