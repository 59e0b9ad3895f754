"""Matrix products: matmul_v2 (batched, transpose flags, numpy's 1-D rules) and the
legacy ``mul`` (inputs flattened to matrices), each with its grad.

Outputs and gradients are written with ``np.matmul(..., out=)`` into the buffers of the
previous step, so a training step allocates no large array here.
"""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError
from ..framework.registry import make_grad_op, register_op
from ._shapes import broadcast_shapes, like_inputs, same_dtype


def _t(a: np.ndarray) -> np.ndarray:
    return a.swapaxes(-1, -2)


def gemm_dtype(dtype) -> type | None:
    """The dtype a GEMM computes in: float32 for float16 operands (numpy has no float16
    GEMM, only a plain loop some 300x slower than BLAS; float32 accumulation rounded once
    to float16 is what float16 GEMMs with float32 accumulators do), else the operands'."""
    return np.float32 if dtype == np.float16 else None


def matmul_shape(xs, ys, trans_x: bool, trans_y: bool, where: str) -> tuple[int, ...]:
    """Output shape of matmul_v2 (works with -1 dims). 1-D operands follow numpy: X [K]
    is a row [1, K], Y [K] a column [K, 1], and that dim is dropped from the output."""
    xs, ys = list(xs), list(ys)
    if not xs or not ys:
        raise ProgramError(f"{where}: operands must have at least one dim")
    x_vec, y_vec = len(xs) == 1, len(ys) == 1
    if x_vec:
        xs, trans_x = [1, *xs], False
    if y_vec:
        ys, trans_y = [*ys, 1], False
    if trans_x:
        xs[-2], xs[-1] = xs[-1], xs[-2]
    if trans_y:
        ys[-2], ys[-1] = ys[-1], ys[-2]
    if xs[-1] != ys[-2] and -1 not in (xs[-1], ys[-2]):
        raise ProgramError(f"{where}: contracted dims differ: X gives {xs[-1]}, Y gives "
                           f"{ys[-2]} (X {xs}, Y {ys} after transposes)")
    shape = [*broadcast_shapes(xs[:-2], ys[:-2], where), xs[-2], ys[-1]]
    if y_vec:
        shape.pop(-1)
    if x_vec:
        shape.pop(-2 if not y_vec else -1)
    return tuple(shape)


def _flags(ctx, x: np.ndarray, y: np.ndarray) -> tuple[bool, bool]:
    # a transpose flag on a 1-D operand means nothing
    return bool(ctx.attr("trans_x")) and x.ndim > 1, bool(ctx.attr("trans_y")) and y.ndim > 1


def _infer_matmul(ctx) -> None:
    shape = matmul_shape(ctx.input_shape("X"), ctx.input_shape("Y"), bool(ctx.attr("trans_x")),
                         bool(ctx.attr("trans_y")), f"op {ctx.op.type!r}")
    ctx.set_output("Out", shape, same_dtype(ctx, "X", "Y"))


_MATMUL_ATTRS = {"trans_x": False, "trans_y": False}


@register_op("matmul_v2", inputs=["X", "Y"], outputs=["Out"], attrs=_MATMUL_ATTRS,
             infer_shape=_infer_matmul,
             grad=make_grad_op("matmul_v2_grad", fwd_inputs=["X", "Y"], in_grads=["X", "Y"]))
def _matmul_v2(ctx) -> None:
    out = write_matmul(ctx, ctx.input("X"), ctx.input("Y"), "Out")
    ctx.set_output("Out", out)


def write_matmul(ctx, x: np.ndarray, y: np.ndarray, slot: str) -> np.ndarray:
    """op(X) @ op(Y) into the buffer of output ``slot``; returns it (not yet set)."""
    tx, ty = _flags(ctx, x, y)
    a, b = (_t(x) if tx else x), (_t(y) if ty else y)
    shape = matmul_shape(a.shape, b.shape, False, False, f"op {ctx.index} ({ctx.op.type})")
    out = ctx.buffer(slot, shape, x.dtype)
    np.matmul(a, b, out=out, dtype=gemm_dtype(out.dtype))
    return out


def _matmul_into(ctx, slot: str, lhs: np.ndarray, rhs: np.ndarray, shape, padded) -> None:
    """Writes lhs @ rhs, summed over batch dims the operand was broadcast along, into the
    gradient ``slot`` of an operand of ``shape`` (``padded``: its shape as a matrix)."""
    grad = ctx.buffer(slot, shape, lhs.dtype)
    full = (*np.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2]), lhs.shape[-2], rhs.shape[-1])
    if full == tuple(padded):
        np.matmul(lhs, rhs, out=grad.reshape(padded), dtype=gemm_dtype(grad.dtype))
    elif lhs.ndim == rhs.ndim and lhs.shape[:-2] == rhs.shape[:-2] and len(padded) == 2:
        # a 2-D operand shared by every batch: one GEMM over the batch folded into K
        lhs2 = np.moveaxis(lhs, -2, 0).reshape(lhs.shape[-2], -1)
        rhs2 = rhs.reshape(-1, rhs.shape[-1])
        np.matmul(lhs2, rhs2, out=grad.reshape(padded), dtype=gemm_dtype(grad.dtype))
    else:
        prod = np.matmul(lhs, rhs, dtype=gemm_dtype(grad.dtype))
        lead = prod.ndim - len(padded)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(padded[:-2]) if d == 1 and prod.shape[lead + i] != 1)
        np.sum(prod, axis=axes, out=grad.reshape([d for i, d in enumerate(prod.shape)
                                                  if i not in axes]))
    ctx.set_output(slot, grad)


@register_op("matmul_v2_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
             attrs=_MATMUL_ATTRS, infer_shape=like_inputs(("X", "X@GRAD"), ("Y", "Y@GRAD")))
def _matmul_v2_grad(ctx) -> None:
    x, y, dout = ctx.input("X"), ctx.input("Y"), ctx.input("Out@GRAD")
    write_matmul_grads(ctx, x, y, dout, "X@GRAD", "Y@GRAD")


def write_matmul_grads(ctx, x: np.ndarray, y: np.ndarray, dout: np.ndarray, x_slot: str,
                       y_slot: str) -> None:
    """matmul_v2's input gradients from dOut into the output slots ``x_slot``/``y_slot``
    (each only if the op has it); shared with fused_gemm_epilogue_grad, so both compute
    the very same GEMMs."""
    tx, ty = _flags(ctx, x, y)
    xp = x.reshape(1, -1) if x.ndim == 1 else x
    yp = y.reshape(-1, 1) if y.ndim == 1 else y
    a_rows = xp.shape[-1] if tx else xp.shape[-2]
    b_cols = yp.shape[-2] if ty else yp.shape[-1]
    batch = np.broadcast_shapes(xp.shape[:-2], yp.shape[:-2])
    dp = dout.reshape(*batch, a_rows, b_cols)
    # Out = A B with A = op(X), B = op(Y): dA = dOut B^T, dB = A^T dOut
    if ctx.has_output(x_slot):
        if tx:      # dX = dA^T = B dOut^T
            lhs, rhs = (_t(yp) if ty else yp), _t(dp)
        else:
            lhs, rhs = dp, (yp if ty else _t(yp))
        _matmul_into(ctx, x_slot, lhs, rhs, x.shape, xp.shape)
    if ctx.has_output(y_slot):
        if ty:      # dY = dB^T = dOut^T A
            lhs, rhs = _t(dp), (_t(xp) if tx else xp)
        else:
            lhs, rhs = (xp if tx else _t(xp)), dp
        _matmul_into(ctx, y_slot, lhs, rhs, y.shape, yp.shape)


# mul: X flattened to [prod(dims < x_num_col_dims), rest], Y likewise, Out = X2 Y2 ----------
_MUL_ATTRS = {"x_num_col_dims": 1, "y_num_col_dims": 1}


def _prod(dims) -> int:
    return int(np.prod(dims)) if -1 not in dims else -1


def _infer_mul(ctx) -> None:
    xs, ys = ctx.input_shape("X"), ctx.input_shape("Y")
    xn, yn = int(ctx.attr("x_num_col_dims")), int(ctx.attr("y_num_col_dims"))
    k_x, k_y = _prod(xs[xn:]), _prod(ys[:yn])
    if -1 not in (k_x, k_y) and k_x != k_y:
        raise ProgramError(f"op 'mul': X {list(xs)} flattens to {k_x} columns but Y "
                           f"{list(ys)} to {k_y} rows")
    ctx.set_output("Out", (*xs[:xn], *ys[yn:]), same_dtype(ctx, "X", "Y"))


def _as_matrices(ctx):
    x, y = ctx.input("X"), ctx.input("Y")
    xn, yn = int(ctx.attr("x_num_col_dims")), int(ctx.attr("y_num_col_dims"))
    x2 = x.reshape(int(np.prod(x.shape[:xn])), -1)
    y2 = y.reshape(int(np.prod(y.shape[:yn])), -1)
    return x, y, x2, y2, (*x.shape[:xn], *y.shape[yn:])


@register_op("mul", inputs=["X", "Y"], outputs=["Out"], attrs=_MUL_ATTRS, infer_shape=_infer_mul,
             grad=make_grad_op("mul_grad", fwd_inputs=["X", "Y"], in_grads=["X", "Y"]))
def _mul(ctx) -> None:
    x, _, x2, y2, shape = _as_matrices(ctx)
    out = ctx.buffer("Out", shape, x.dtype)
    np.matmul(x2, y2, out=out.reshape(x2.shape[0], y2.shape[1]),
              dtype=gemm_dtype(out.dtype))
    ctx.set_output("Out", out)


@register_op("mul_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
             attrs=_MUL_ATTRS, infer_shape=like_inputs(("X", "X@GRAD"), ("Y", "Y@GRAD")))
def _mul_grad(ctx) -> None:
    x, y, x2, y2, _ = _as_matrices(ctx)
    d2 = ctx.input("Out@GRAD").reshape(x2.shape[0], y2.shape[1])
    for slot, shape, lhs, rhs in (("X@GRAD", x.shape, d2, y2.T), ("Y@GRAD", y.shape, x2.T, d2)):
        if ctx.has_output(slot):
            grad = ctx.buffer(slot, shape, x.dtype)
            np.matmul(lhs, rhs, out=grad.reshape(lhs.shape[0], rhs.shape[1]),
                      dtype=gemm_dtype(grad.dtype))
            ctx.set_output(slot, grad)
