"""What the parity workers (tp_parity, sharding_parity, fleet_compat) share: a case's programs
verified and started on this rank, the axis each parameter is cut along recorded, and the
parameters after the last step written (keys ``<case>|axis|<param>``, ``<case>|final|<param>``).
Not a worker itself: the workers import it."""

from __future__ import annotations

import numpy as np

import ringflow as rf


def start(case, main, startup, out: dict) -> tuple[rf.Scope, rf.Executor, list[str]]:
    """Verify both programs, run startup in a new scope; (scope, executor, parameter names)."""
    rf.verify(main)
    rf.verify(startup)
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(startup, scope=scope)
    params = [p.name for p in main.all_parameters()]
    for name in params:
        axis = main.global_block().var(name).split_axis
        out[f"{case.key}|axis|{name}"] = np.array(-1 if axis is None else axis)
    return scope, exe, params


def keep_final(case, scope: rf.Scope, params: list[str], out: dict) -> None:
    for name in params:
        out[f"{case.key}|final|{name}"] = np.array(scope[name])
