"""Mixed-precision ops: Paddle's ``check_finite_and_unscale`` and ``update_loss_scaling``
(dynamic loss scaling), and ringflow's ``skip_update_begin`` / ``skip_update_end``, which
leave every parameter and optimizer state exactly as it was when the gradients of a step
were not finite. None has a gradient: they run in the optimizer section.

    check_finite_and_unscale   found = any(!isfinite(X_i)); Out_i = X_i * (1 / Scale)
    update_loss_scaling        found: Out_i = 0, bad += 1, good = 0, and after
                               decr_every_n_nan_or_inf bad steps scale = max(scale * decr, 1);
                               else Out_i = X_i, good += 1, bad = 0, and after
                               incr_every_n_steps good steps scale *= incr (if finite)
    skip_update_begin          found: Saved_i = copy of X_i (the state the update ops write)
    skip_update_end            found: Out_i = Saved_i, and the copies leave the scope
"""

from __future__ import annotations

import numpy as np

from ..framework.registry import register_op
from ._shapes import like_inputs


def _found(ctx) -> bool:
    return bool(np.asarray(ctx.input("FoundInfinite")).reshape(-1)[0])


def _infer_flag(ctx) -> None:
    like_inputs(("X", "Out"))(ctx)
    ctx.set_output("FoundInfinite", (1,), "bool")


# check_finite_and_unscale ------------------------------------------------------------------
@register_op("check_finite_and_unscale", inputs=["X*", "Scale"],
             outputs=["Out*", "FoundInfinite"], infer_shape=_infer_flag)
def _check_finite_and_unscale(ctx) -> None:
    xs = ctx.inputs("X")
    scale = float(np.asarray(ctx.input("Scale")).reshape(-1)[0])
    # Paddle computes 1 / scale once, in float32 (the scale's dtype).
    inverse = np.float32(1.0) / np.float32(scale)
    found = False
    for i, x in enumerate(xs):
        found = found or not bool(np.isfinite(x).all())
        out = ctx.buffer("Out", x.shape, x.dtype, i)
        # float16 is multiplied in float32 and rounded once
        np.multiply(x, inverse, out=out, casting="same_kind")
        ctx.set_output("Out", out, i)
    ctx.set_output("FoundInfinite", np.array([found], dtype=bool))


# update_loss_scaling -------------------------------------------------------------------------
_SCALING_ATTRS = {"incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2, "incr_ratio": 2.0,
                  "decr_ratio": 0.8, "stop_update": False}


def _infer_scaling(ctx) -> None:
    like_inputs(("X", "Out"), ("PrevLossScaling", "LossScaling"), ("InGoodSteps", "OutGoodSteps"),
                ("InBadSteps", "OutBadSteps"))(ctx)


def next_loss_scaling(scale: np.floating, good: int, bad: int, found: bool,
                      attr) -> tuple[np.floating, int, int]:
    """(scale, good steps, bad steps) after one step, Paddle's ``update_loss_scaling``;
    ``scale`` is a numpy scalar of the scale's dtype, in which the products are taken."""
    kind = type(scale)
    if found:
        good, bad = 0, bad + 1
        if bad == int(attr("decr_every_n_nan_or_inf")):
            scale, bad = max(scale * kind(attr("decr_ratio")), kind(1.0)), 0
        return scale, good, bad
    good, bad = good + 1, 0
    if good == int(attr("incr_every_n_steps")):
        with np.errstate(over="ignore"):
            grown = scale * kind(attr("incr_ratio"))
        scale, good = (grown if np.isfinite(grown) else scale), 0
    return scale, good, bad


@register_op("update_loss_scaling",
             inputs=["X*", "FoundInfinite", "PrevLossScaling", "InGoodSteps", "InBadSteps",
                     "StopUpdate?"],
             outputs=["Out*", "LossScaling", "OutGoodSteps", "OutBadSteps"],
             attrs=_SCALING_ATTRS, infer_shape=_infer_scaling)
def _update_loss_scaling(ctx) -> None:
    found = _found(ctx)
    for i, x in enumerate(ctx.inputs("X")):
        if found:   # the step is skipped: nothing of its gradients may reach a parameter
            out = ctx.buffer("Out", x.shape, x.dtype, i)
            out.fill(0)
            ctx.set_output("Out", out, i)
        elif ctx.op.outputs["Out"][i] != ctx.op.inputs["X"][i]:
            ctx.set_output("Out", x, i)
    prev = ctx.input("PrevLossScaling")
    good, bad = ctx.input("InGoodSteps"), ctx.input("InBadSteps")
    stop = bool(ctx.attr("stop_update")) or (
        ctx.has_input("StopUpdate") and bool(np.asarray(ctx.input("StopUpdate")).reshape(-1)[0]))
    scale, n_good, n_bad = prev.reshape(-1)[0], int(good.reshape(-1)[0]), int(bad.reshape(-1)[0])
    if not stop:
        scale, n_good, n_bad = next_loss_scaling(scale, n_good, n_bad, found, ctx.attr)
    ctx.set_output("LossScaling", np.full(prev.shape, scale, prev.dtype))
    ctx.set_output("OutGoodSteps", np.full(good.shape, n_good, good.dtype))
    ctx.set_output("OutBadSteps", np.full(bad.shape, n_bad, bad.dtype))


# skip_update_begin / skip_update_end -------------------------------------------------------
# The update ops between them write parameters and moments in place; when the step's
# gradients were not finite, begin copies what they will write and end puts it back. A
# finite step copies nothing, so the pair costs two flag reads.


@register_op("skip_update_begin", inputs=["X*", "FoundInfinite"], outputs=["Saved*"],
             infer_shape=like_inputs(("X", "Saved")))
def _skip_update_begin(ctx) -> None:
    if _found(ctx):
        ctx.set_outputs("Saved", [np.array(x, copy=True) for x in ctx.inputs("X")])


@register_op("skip_update_end", inputs=["Saved*", "FoundInfinite"], outputs=["Out*"],
             infer_shape=like_inputs(("Saved", "Out")))
def _skip_update_end(ctx) -> None:
    if not _found(ctx):
        return
    names = ctx.op.inputs["Saved"]
    ctx.set_outputs("Out", [ctx.scope[n] for n in names])
    ctx.scope.drop(names)   # a copy of the whole optimizer state: not kept a step longer
