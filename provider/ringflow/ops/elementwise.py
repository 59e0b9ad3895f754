"""Binary elementwise ops with Paddle's broadcasting: elementwise_add, _sub, _mul, _div,
_max, _min, and their grads, which sum over the broadcast dims.

Paddle's rule: with ``axis == -1`` the shapes broadcast as in numpy; otherwise the input
with fewer dims lines up with the other one starting at dim ``axis``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..framework.registry import make_grad_op, register_op
from ._shapes import aligned_y_shape, broadcast_shapes, like_inputs, same_dtype

# full-shape gradient of one input: fn(dout, x, y, out, result) writes into result
GradFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], object]


def aligned_shapes(x_shape, y_shape, axis: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Both shapes padded to one rank by Paddle's rule (see the module docstring)."""
    if len(x_shape) >= len(y_shape):
        return tuple(x_shape), aligned_y_shape(x_shape, y_shape, axis)
    return aligned_y_shape(y_shape, x_shape, axis), tuple(y_shape)


def _infer(ctx) -> None:
    xs, ys = aligned_shapes(ctx.input_shape("X"), ctx.input_shape("Y"), int(ctx.attr("axis")))
    shape = broadcast_shapes(xs, ys, f"op {ctx.op.type!r} (X {list(xs)}, Y {list(ys)})")
    ctx.set_output("Out", shape, same_dtype(ctx, "X", "Y"))


def _inputs(ctx) -> tuple[np.ndarray, np.ndarray]:
    x, y = ctx.input("X"), ctx.input("Y")
    xs, ys = aligned_shapes(x.shape, y.shape, int(ctx.attr("axis")))
    return x.reshape(xs), y.reshape(ys)


def _forward(ufunc: np.ufunc):
    def kernel(ctx) -> None:
        x, y = _inputs(ctx)
        out = ctx.buffer("Out", np.broadcast_shapes(x.shape, y.shape), x.dtype)
        # int division truncates toward zero, as Paddle's (unsafe cast of the true quotient)
        casting = "unsafe" if x.dtype.kind in "iu" else "same_kind"
        ufunc(x, y, out=out, casting=casting)
        ctx.set_output("Out", out)

    return kernel


def _sum_into(full: np.ndarray, shape: tuple[int, ...], dest: np.ndarray) -> None:
    """Sums ``full`` over the dims that were broadcast from ``shape`` into ``dest``."""
    lead = full.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and full.shape[lead + i] != 1)
    kept = tuple(d for i, d in enumerate(full.shape) if i not in axes)
    # float16 is summed in float32 and rounded once (a bias gradient sums a whole batch)
    wide = np.float32 if dest.dtype == np.float16 else None
    np.sum(full, axis=axes, out=dest.reshape(kept), dtype=wide)


def _grad(dx_fn: GradFn | None, dy_fn: GradFn | None):
    """A grad kernel; ``None`` means the gradient is dOut itself. One such gradient is
    handed out as dOut's array (dOut has no other reader); a second one is a copy, so two
    gradient variables never share an array that an in-place op could update."""

    def kernel(ctx) -> None:
        x, y = _inputs(ctx)
        dout = ctx.input("Out@GRAD")
        out = ctx.input("Out") if ctx.has_input("Out") else None
        aliased = False
        for slot, arr, fn in (("X", x, dx_fn), ("Y", y, dy_fn)):
            gslot = slot + "@GRAD"
            if not ctx.has_output(gslot):
                continue
            shape = ctx.input(slot).shape
            if arr.shape == dout.shape and fn is None and not aliased:
                ctx.set_output(gslot, dout.reshape(shape))
                aliased = True
                continue
            grad = ctx.buffer(gslot, shape, dout.dtype)
            if arr.shape == dout.shape:
                if fn is None:
                    np.copyto(grad.reshape(arr.shape), dout)
                else:
                    fn(dout, x, y, out, grad.reshape(arr.shape))
            else:
                full = dout if fn is None else np.empty(dout.shape, dout.dtype)
                if fn is not None:
                    fn(dout, x, y, out, full)
                _sum_into(full, arr.shape, grad)
            ctx.set_output(gslot, grad)

    return kernel


def _register(type: str, ufunc: np.ufunc, dx: GradFn | None, dy: GradFn | None,
              fwd_outputs: tuple[str, ...] = ()) -> None:
    attrs = {"axis": -1}
    register_op(type, inputs=["X", "Y"], outputs=["Out"], attrs=attrs, infer_shape=_infer,
                grad=make_grad_op(f"{type}_grad", fwd_inputs=["X", "Y"],
                                  fwd_outputs=fwd_outputs, in_grads=["X", "Y"]))(_forward(ufunc))
    register_op(f"{type}_grad", inputs=["X", "Y", "Out?", "Out@GRAD"],
                outputs=["X@GRAD?", "Y@GRAD?"], attrs=attrs,
                infer_shape=like_inputs(("X", "X@GRAD"), ("Y", "Y@GRAD")))(_grad(dx, dy))


# d(x - y)/dy = -1
def _neg(d, x, y, o, r):
    return np.negative(d, out=r)


# d(x y)/dx = y, d(x y)/dy = x
def _times_y(d, x, y, o, r):
    return np.multiply(d, y, out=r)


def _times_x(d, x, y, o, r):
    return np.multiply(d, x, out=r)


# d(x / y)/dx = 1 / y, d(x / y)/dy = -out / y
def _over_y(d, x, y, o, r):
    return np.divide(d, y, out=r)


def _div_dy(d, x, y, o, r):
    np.multiply(d, o, out=r)
    r /= y
    return np.negative(r, out=r)


# max/min route the gradient to the chosen input; ties go to Y, as in Paddle
def _where(cmp: np.ufunc) -> GradFn:
    def fn(d, x, y, o, r):
        return np.multiply(d, cmp(x, y), out=r)

    return fn


_register("elementwise_add", np.add, None, None)
_register("elementwise_sub", np.subtract, None, _neg)
_register("elementwise_mul", np.multiply, _times_y, _times_x)
_register("elementwise_div", np.divide, _over_y, _div_dy, fwd_outputs=("Out",))
_register("elementwise_max", np.maximum, _where(np.greater), _where(np.less_equal))
_register("elementwise_min", np.minimum, _where(np.less), _where(np.greater_equal))
