"""Arithmetic ops: scale, cast, sum (gradient accumulation), mean, reduce_sum,
reduce_mean, sqrt, square, each next to its gradient.

Elementwise binary ops live in ``elementwise.py``, matrix products in ``matmul.py``.
"""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError
from ..framework.registry import (
    OpDesc,
    grad_var_name,
    make_grad_op,
    register_op,
    same_shape_as,
)
from ._shapes import like_inputs, norm_axis, same_dtype
from .creation import attr_dtype

# scale: Out = scale * X + bias (or scale * (X + bias)); grad = scale * dOut ---------------


def _scale_grad(op, no_grad: frozenset) -> list[OpDesc]:
    x = op.inputs["X"][0]
    if x in no_grad:
        return []
    return [OpDesc("scale", {"X": [grad_var_name(op.outputs["Out"][0])]},
                   {"Out": [grad_var_name(x)]},
                   {"scale": float(op.attr("scale")), "bias": 0.0, "bias_after_scale": True})]


@register_op("scale", inputs=["X"], outputs=["Out"],
             attrs={"scale": 1.0, "bias": 0.0, "bias_after_scale": True},
             infer_shape=same_shape_as(), grad=_scale_grad)
def _scale(ctx) -> None:
    x = ctx.input("X")
    scale, bias = float(ctx.attr("scale")), float(ctx.attr("bias"))
    if not ctx.attr("bias_after_scale"):
        bias *= scale
    if x.dtype.kind != "f":
        ctx.set_output("Out", (x * scale + bias).astype(x.dtype))
        return
    out = ctx.buffer("Out", x.shape, x.dtype)
    np.multiply(x, scale, out=out)
    if bias:
        out += bias
    ctx.set_output("Out", out)


# cast: Out = X as out_dtype; grad = dOut cast back (float inputs only) --------------------


def _cast_grad(op, no_grad: frozenset) -> list[OpDesc]:
    x = op.inputs["X"][0]
    in_dtype, out_dtype = attr_dtype(op.attr("in_dtype")), attr_dtype(op.attr("out_dtype"))
    if x in no_grad or np.dtype(in_dtype).kind != "f" or np.dtype(out_dtype).kind != "f":
        return []
    return [OpDesc("cast", {"X": [grad_var_name(op.outputs["Out"][0])]},
                   {"Out": [grad_var_name(x)]}, {"in_dtype": out_dtype, "out_dtype": in_dtype})]


def _infer_cast(ctx) -> None:
    ctx.set_output("Out", ctx.input_shape("X"), attr_dtype(ctx.attr("out_dtype")))


@register_op("cast", inputs=["X"], outputs=["Out"],
             attrs={"in_dtype": "float32", "out_dtype": "float32"},
             infer_shape=_infer_cast, grad=_cast_grad)
def _cast(ctx) -> None:
    # A value beyond float16 becomes inf without a warning: mixed precision expects it
    # (check_finite_and_unscale finds it and the step is skipped).
    with np.errstate(over="ignore"):
        ctx.set_output("Out", ctx.input("X").astype(attr_dtype(ctx.attr("out_dtype"))))


# sum: Out = X[0] + X[1] + ... (how backward accumulates a variable's gradients) -----------


def _sum_grad(op, no_grad: frozenset) -> list[OpDesc]:
    dout = grad_var_name(op.outputs["Out"][0])
    return [OpDesc("assign", {"X": [dout]}, {"Out": [grad_var_name(n)]})
            for n in op.inputs["X"] if n not in no_grad]


def _infer_sum(ctx) -> None:
    shapes = ctx.input_shapes("X")
    if any(s != shapes[0] for s in shapes):
        raise ProgramError(f"op 'sum': inputs {ctx.input_names('X')} must have one shape, "
                           f"got {[list(s) for s in shapes]}")
    ctx.set_output("Out", shapes[0], same_dtype(ctx, "X"))


@register_op("sum", inputs=["X*"], outputs=["Out"], infer_shape=_infer_sum, grad=_sum_grad)
def _sum(ctx) -> None:
    xs = ctx.inputs("X")
    if len(xs) == 1:
        ctx.set_output("Out", np.array(xs[0], copy=True))
        return
    # A fresh array: Out may be one of the inputs (in-place accumulation).
    out = np.add(xs[0], xs[1])
    for x in xs[2:]:
        out += x
    ctx.set_output("Out", out)


# mean: Out[1] = mean(X) ---------------------------------------------------------------------


def _infer_scalar(ctx) -> None:
    ctx.set_output("Out", (1,), ctx.input_dtype("X"))


@register_op("mean", inputs=["X"], outputs=["Out"], infer_shape=_infer_scalar,
             grad=make_grad_op("mean_grad", fwd_inputs=["X"]))
def _mean(ctx) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", np.mean(x, dtype=x.dtype).reshape(1))


@register_op("mean_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
             infer_shape=like_inputs(("X", "X@GRAD")))
def _mean_grad(ctx) -> None:
    x, dout = ctx.input("X"), ctx.input("Out@GRAD")
    dx = ctx.buffer("X@GRAD", x.shape, x.dtype)
    dx.fill(dout.reshape(-1)[0] / max(x.size, 1))
    ctx.set_output("X@GRAD", dx)


# reduce_sum / reduce_mean over `dim` (all dims when reduce_all) -----------------------------
_REDUCE_ATTRS = {"dim": [0], "keep_dim": False, "reduce_all": False}


def _reduced_axes(attr, ndim: int) -> tuple[int, ...]:
    if attr("reduce_all"):
        return tuple(range(ndim))
    dims = attr("dim")
    dims = [dims] if isinstance(dims, int) else list(dims)
    axes = sorted({norm_axis(int(d), ndim) for d in dims})
    return tuple(range(ndim)) if not axes else tuple(axes)


def _reduced_shape(shape, axes, keep_dim: bool) -> tuple[int, ...]:
    if keep_dim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    return kept or (1,)   # a full reduction is shape [1], as in Paddle's legacy programs


def _infer_reduce(ctx) -> None:
    shape = ctx.input_shape("X")
    axes = _reduced_axes(ctx.attr, len(shape))
    ctx.set_output("Out", _reduced_shape(shape, axes, bool(ctx.attr("keep_dim"))),
                   ctx.input_dtype("X"))


def _reduce(ctx, fn) -> None:
    x = ctx.input("X")
    axes = _reduced_axes(ctx.attr, x.ndim)
    out = fn(x, axis=axes, dtype=x.dtype, keepdims=bool(ctx.attr("keep_dim")))
    ctx.set_output("Out", np.reshape(out, _reduced_shape(x.shape, axes, ctx.attr("keep_dim"))))


def _reduce_grad(ctx, mean: bool) -> None:
    x, dout = ctx.input("X"), ctx.input("Out@GRAD")
    axes = _reduced_axes(ctx.attr, x.ndim)
    kept = dout.reshape(_reduced_shape(x.shape, axes, True))
    dx = ctx.buffer("X@GRAD", x.shape, x.dtype)
    if mean:
        n = int(np.prod([x.shape[a] for a in axes]))
        np.multiply(kept, 1.0 / max(n, 1), out=dx)
    else:
        np.copyto(dx, kept)
    ctx.set_output("X@GRAD", dx)


@register_op("reduce_sum", inputs=["X"], outputs=["Out"], attrs=_REDUCE_ATTRS,
             infer_shape=_infer_reduce, grad=make_grad_op("reduce_sum_grad", fwd_inputs=["X"]))
def _reduce_sum(ctx) -> None:
    _reduce(ctx, np.sum)


@register_op("reduce_sum_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
             attrs=_REDUCE_ATTRS, infer_shape=like_inputs(("X", "X@GRAD")))
def _reduce_sum_grad(ctx) -> None:
    _reduce_grad(ctx, mean=False)


@register_op("reduce_mean", inputs=["X"], outputs=["Out"], attrs=_REDUCE_ATTRS,
             infer_shape=_infer_reduce, grad=make_grad_op("reduce_mean_grad", fwd_inputs=["X"]))
def _reduce_mean(ctx) -> None:
    _reduce(ctx, np.mean)


@register_op("reduce_mean_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
             attrs=_REDUCE_ATTRS, infer_shape=like_inputs(("X", "X@GRAD")))
def _reduce_mean_grad(ctx) -> None:
    _reduce_grad(ctx, mean=True)


# sqrt, square -------------------------------------------------------------------------------


@register_op("sqrt", inputs=["X"], outputs=["Out"], infer_shape=same_shape_as(),
             grad=make_grad_op("sqrt_grad", fwd_outputs=["Out"]))
def _sqrt(ctx) -> None:
    ctx.set_output("Out", np.sqrt(ctx.input("X")))


@register_op("sqrt_grad", inputs=["Out", "Out@GRAD"], outputs=["X@GRAD"],
             infer_shape=like_inputs(("Out", "X@GRAD")))
def _sqrt_grad(ctx) -> None:
    out = ctx.input("Out")
    dx = np.multiply(ctx.input("Out@GRAD"), 0.5)
    dx /= out
    ctx.set_output("X@GRAD", dx)


@register_op("square", inputs=["X"], outputs=["Out"], infer_shape=same_shape_as(),
             grad=make_grad_op("square_grad", fwd_inputs=["X"]))
def _square(ctx) -> None:
    ctx.set_output("Out", np.square(ctx.input("X")))


@register_op("square_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
             infer_shape=like_inputs(("X", "X@GRAD")))
def _square_grad(ctx) -> None:
    dx = np.multiply(ctx.input("X"), 2.0)
    dx *= ctx.input("Out@GRAD")
    ctx.set_output("X@GRAD", dx)
