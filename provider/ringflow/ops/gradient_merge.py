"""Gradient merge (accumulation) ops, ringflow's pair for fleet's ``gradient_merge``: a
step counter that says whether this run applies the merged gradients, and the reset of the
accumulators after a run that applied them. None has a gradient: they run around the
optimizer section.

    gradient_merge_step    StepOut = Step + 1; Skip = (Step + 1) % k_steps != 0
    gradient_merge_clear   not Skip: Out_i = 0 (the accumulators start over); else Out_i = X_i
"""

from __future__ import annotations

import numpy as np

from ..framework.registry import register_op
from ._shapes import like_inputs


def _infer_step(ctx) -> None:
    like_inputs(("Step", "StepOut"))(ctx)
    ctx.set_output("Skip", (1,), "bool")


@register_op("gradient_merge_step", inputs=["Step"], outputs=["StepOut", "Skip"],
             attrs={"k_steps": 1}, infer_shape=_infer_step)
def _gradient_merge_step(ctx) -> None:
    step = ctx.input("Step")
    after = step + 1
    ctx.set_output("StepOut", after)
    k = int(ctx.attr("k_steps"))
    ctx.set_output("Skip", np.array([int(after.reshape(-1)[0]) % k != 0], dtype=bool))


@register_op("gradient_merge_clear", inputs=["X*", "Skip"], outputs=["Out*"],
             infer_shape=like_inputs(("X", "Out")))
def _gradient_merge_clear(ctx) -> None:
    if bool(np.asarray(ctx.input("Skip")).reshape(-1)[0]):
        return
    for i, x in enumerate(ctx.inputs("X")):
        ctx.set_output("Out", np.zeros_like(x), i)
