"""Reduction operators (Paddle's `ReduceOp` names and values) and their numpy ufuncs."""

from __future__ import annotations

import numpy as np

from ringflow.errors import ExecutionError


class ReduceOp:
    SUM = 0
    MAX = 1
    MIN = 2
    PROD = 3
    AVG = 4


_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum,
           ReduceOp.PROD: np.multiply, ReduceOp.AVG: np.add}
_NAMES = {v: k for k, v in vars(ReduceOp).items() if not k.startswith("_")}


def ufunc_for(op: int, dtype: np.dtype) -> np.ufunc:
    if op not in _UFUNCS:
        raise ExecutionError(f"unknown reduce op {op!r}; expected one of ReduceOp."
                             f"{', ReduceOp.'.join(_NAMES.values())}")
    if op == ReduceOp.AVG and not np.issubdtype(dtype, np.floating):
        raise ExecutionError(f"ReduceOp.AVG needs a floating dtype, got {dtype}")
    return _UFUNCS[op]


def op_name(op: int) -> str:
    return _NAMES.get(op, str(op))
