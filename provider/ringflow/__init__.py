"""ringflow: a PaddlePaddle-style static-graph runtime on numpy, fleet with Paddle's
tensor-parallel rewrite and parallel layers, a ring all-reduce over shared memory and TCP,
built-in models, and a launcher.

Numpy only, never Airflow: this package is shipped to training hosts. Names are imported
lazily (PEP 562) so ``import ringflow`` in a worker costs little and each piece loads when
first used.
"""

from __future__ import annotations

from ._lazy import Exports, lazy_exports

__version__ = "0.1.0"

_EXPORTS: Exports = {
    "Program": ("ringflow.framework.program", "Program"),
    "program_guard": ("ringflow.framework.program", "program_guard"),
    "default_main_program": ("ringflow.framework.program", "default_main_program"),
    "default_startup_program": ("ringflow.framework.program", "default_startup_program"),
    "data": ("ringflow.framework.layer_helper", "data"),
    "ParamAttr": ("ringflow.framework.layer_helper", "ParamAttr"),
    "initializer": ("ringflow.initializer", None),
    "nn": ("ringflow.nn", None),
    "optimizer": ("ringflow.optimizer", None),
    "ClipGradByGlobalNorm": ("ringflow.optimizer.clip", "ClipGradByGlobalNorm"),
    "append_backward": ("ringflow.backward", "append_backward"),
    "gradients": ("ringflow.backward", "gradients"),
    "Executor": ("ringflow.executor", "Executor"),
    "BuildStrategy": ("ringflow.compiler", "BuildStrategy"),
    "CompiledProgram": ("ringflow.compiler", "CompiledProgram"),
    "Scope": ("ringflow.executor", "Scope"),
    "global_scope": ("ringflow.executor", "global_scope"),
    "verify": ("ringflow.framework.verify", "verify"),
    "save": ("ringflow.io", "save"),
    "load": ("ringflow.io", "load"),
    "distributed": ("ringflow.distributed", None),
    "models": ("ringflow.models", None),
    "errors": ("ringflow.errors", None),
    "framework": ("ringflow.framework", None),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports('ringflow', globals(), _EXPORTS)
