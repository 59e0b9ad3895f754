"""Ops with integer or boolean results, hence no gradient: the comparisons (equal,
not_equal, less_than, less_equal, greater_than, greater_equal, with elementwise
broadcasting) and arg_max / arg_min."""

from __future__ import annotations

import numpy as np

from ..framework.registry import register_op
from ._shapes import broadcast_shapes, norm_axis
from .creation import attr_dtype
from .elementwise import aligned_shapes


def _infer_compare(ctx) -> None:
    xs, ys = aligned_shapes(ctx.input_shape("X"), ctx.input_shape("Y"), int(ctx.attr("axis")))
    ctx.set_output("Out", broadcast_shapes(xs, ys, f"op {ctx.op.type!r}"), "bool")


def _register_compare(type: str, ufunc: np.ufunc) -> None:
    def kernel(ctx) -> None:
        x, y = ctx.input("X"), ctx.input("Y")
        xs, ys = aligned_shapes(x.shape, y.shape, int(ctx.attr("axis")))
        ctx.set_output("Out", ufunc(x.reshape(xs), y.reshape(ys)))

    register_op(type, inputs=["X", "Y"], outputs=["Out"], attrs={"axis": -1, "force_cpu": False},
                infer_shape=_infer_compare)(kernel)


for _type, _ufunc in (("equal", np.equal), ("not_equal", np.not_equal),
                      ("less_than", np.less), ("less_equal", np.less_equal),
                      ("greater_than", np.greater), ("greater_equal", np.greater_equal)):
    _register_compare(_type, _ufunc)


# arg_max / arg_min: indices along `axis` (over everything when `flatten`) ------------------
_ARG_ATTRS = {"axis": -1, "keepdims": False, "flatten": False, "dtype": "int64"}


def _arg_shape(shape, attr) -> tuple[int, ...]:
    if attr("flatten"):
        return (1,) * len(shape) if attr("keepdims") else (1,)
    axis = norm_axis(int(attr("axis")), len(shape))
    if attr("keepdims"):
        return tuple(1 if i == axis else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i != axis) or (1,)


def _register_arg(type: str, fn) -> None:
    def infer(ctx) -> None:
        ctx.set_output("Out", _arg_shape(ctx.input_shape("X"), ctx.attr),
                       attr_dtype(ctx.attr("dtype")))

    def kernel(ctx) -> None:
        x = ctx.input("X")
        axis = None if ctx.attr("flatten") else norm_axis(int(ctx.attr("axis")), x.ndim)
        out = fn(x, axis=axis)
        ctx.set_output("Out", np.reshape(out, _arg_shape(x.shape, ctx.attr))
                       .astype(attr_dtype(ctx.attr("dtype"))))

    register_op(type, inputs=["X"], outputs=["Out"], attrs=_ARG_ATTRS, infer_shape=infer)(kernel)


_register_arg("arg_max", np.argmax)
_register_arg("arg_min", np.argmin)
