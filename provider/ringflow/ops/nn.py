"""Network layers' ops: softmax, layer_norm, dropout, lookup_table_v2 (embedding), each
next to its grad op."""

from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, ProgramError
from ..framework.registry import make_grad_op, register_op, same_shape_as
from ._shapes import known_shape, like_inputs, norm_axis

# softmax: Out = exp(X - max) / sum; dX = Out (dOut - sum(dOut Out)) ----------------------


@register_op("softmax", inputs=["X"], outputs=["Out"], attrs={"axis": -1},
             infer_shape=same_shape_as(),
             grad=make_grad_op("softmax_grad", fwd_outputs=["Out"]))
def _softmax(ctx) -> None:
    x = ctx.input("X")
    axis = norm_axis(int(ctx.attr("axis")), x.ndim)
    out = ctx.buffer("Out", x.shape, x.dtype)
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    ctx.set_output("Out", out)


@register_op("softmax_grad", inputs=["Out", "Out@GRAD"], outputs=["X@GRAD"],
             attrs={"axis": -1}, infer_shape=like_inputs(("Out", "X@GRAD")))
def _softmax_grad(ctx) -> None:
    out, dout = ctx.input("Out"), ctx.input("Out@GRAD")
    axis = norm_axis(int(ctx.attr("axis")), out.ndim)
    dx = ctx.buffer("X@GRAD", out.shape, out.dtype)
    dot = np.sum(dout * out, axis=axis, keepdims=True)
    np.subtract(dout, dot, out=dx)
    dx *= out
    ctx.set_output("X@GRAD", dx)


# layer_norm over dims [begin_norm_axis, ...): Y = (X - mean) / sqrt(var + eps) * Scale + Bias
_LN_ATTRS = {"epsilon": 1e-5, "begin_norm_axis": 1}


def _ln_split(shape, begin: int) -> tuple[int, int]:
    left = int(np.prod(shape[:begin])) if -1 not in shape[:begin] else -1
    return left, int(np.prod(shape[begin:]))


def _infer_layer_norm(ctx) -> None:
    shape, dtype = ctx.input_shape("X"), ctx.input_dtype("X")
    begin = norm_axis(int(ctx.attr("begin_norm_axis")), len(shape), ctx)
    left, right = _ln_split(shape, begin)
    for slot in ("Scale", "Bias"):
        got = known_shape(ctx, slot) if ctx.has_input(slot) else None
        if got is not None and int(np.prod(got)) != right:
            raise ProgramError(f"op 'layer_norm': {slot} {list(got)} must have {right} "
                               f"elements (X {list(shape)} normalised from dim {begin})")
    ctx.set_output("Y", shape, dtype)
    ctx.set_output("Mean", (left,), dtype)
    ctx.set_output("Variance", (left,), dtype)


def _ln_normalised(x2: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float):
    """(x - mean) / sqrt(var + eps) and 1 / sqrt(var + eps), rows of ``x2``."""
    inv = 1.0 / np.sqrt(var + eps)
    xhat = x2 - mean[:, None]
    xhat *= inv[:, None]
    return xhat, inv


@register_op("layer_norm", inputs=["X", "Scale?", "Bias?"], outputs=["Y", "Mean", "Variance"],
             attrs=_LN_ATTRS, infer_shape=_infer_layer_norm,
             grad=make_grad_op("layer_norm_grad", fwd_inputs=["X", "Scale", "Bias"],
                               fwd_outputs=["Mean", "Variance"], out_grads=["Y"],
                               in_grads=["X", "Scale", "Bias"]))
def _layer_norm(ctx) -> None:
    x = ctx.input("X")
    begin = norm_axis(int(ctx.attr("begin_norm_axis")), x.ndim)
    x2 = x.reshape(_ln_split(x.shape, begin))
    mean = x2.mean(axis=1)
    var = x2.var(axis=1)
    xhat, _ = _ln_normalised(x2, mean, var, float(ctx.attr("epsilon")))
    if ctx.has_input("Scale"):
        xhat *= ctx.input("Scale").reshape(-1)
    if ctx.has_input("Bias"):
        xhat += ctx.input("Bias").reshape(-1)
    ctx.set_output("Y", xhat.reshape(x.shape))
    ctx.set_output("Mean", mean)
    ctx.set_output("Variance", var)


@register_op("layer_norm_grad",
             inputs=["X", "Scale?", "Bias?", "Mean", "Variance", "Y@GRAD"],
             outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=_LN_ATTRS,
             infer_shape=like_inputs(("X", "X@GRAD"), ("Scale", "Scale@GRAD"),
                                     ("Bias", "Bias@GRAD")))
def _layer_norm_grad(ctx) -> None:
    x, dy = ctx.input("X"), ctx.input("Y@GRAD")
    begin = norm_axis(int(ctx.attr("begin_norm_axis")), x.ndim)
    rows = _ln_split(x.shape, begin)
    x2, dy2 = x.reshape(rows), dy.reshape(rows)
    xhat, inv = _ln_normalised(x2, ctx.input("Mean"), ctx.input("Variance"),
                               float(ctx.attr("epsilon")))
    if ctx.has_output("Scale@GRAD"):
        scale = ctx.input("Scale")
        ctx.set_output("Scale@GRAD", np.sum(dy2 * xhat, axis=0).reshape(scale.shape))
    if ctx.has_output("Bias@GRAD"):
        ctx.set_output("Bias@GRAD", np.sum(dy2, axis=0).reshape(ctx.input("Bias").shape))
    if ctx.has_output("X@GRAD"):
        g = dy2 * ctx.input("Scale").reshape(-1) if ctx.has_input("Scale") else dy2.copy()
        # dX = inv (g - mean(g) - xhat mean(g xhat)), row by row
        proj = np.mean(g * xhat, axis=1, keepdims=True)
        g -= g.mean(axis=1, keepdims=True)
        g -= xhat * proj
        g *= inv[:, None]
        ctx.set_output("X@GRAD", g.reshape(x.shape))


# dropout ---------------------------------------------------------------------------------------
# upscale_in_train: train Out = X Mask / (1 - p), test Out = X;
# downgrade_in_infer: train Out = X Mask, test Out = X (1 - p). Mask is uint8.
_DROPOUT_ATTRS = {"dropout_prob": 0.5, "is_test": False, "fix_seed": False, "seed": 0,
                  "dropout_implementation": "upscale_in_train"}


def _infer_dropout(ctx) -> None:
    shape = ctx.input_shape("X")
    ctx.set_output("Out", shape, ctx.input_dtype("X"))
    ctx.set_output("Mask", shape, "uint8")


def _keep_scale(ctx) -> float:
    """The factor kept elements are multiplied by in training."""
    p = float(ctx.attr("dropout_prob"))
    if ctx.attr("dropout_implementation") == "upscale_in_train":
        return 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return 1.0


@register_op("dropout", inputs=["X"], outputs=["Out", "Mask"], attrs=_DROPOUT_ATTRS,
             infer_shape=_infer_dropout,
             grad=make_grad_op("dropout_grad", fwd_outputs=["Mask"]))
def _dropout(ctx) -> None:
    x = ctx.input("X")
    p = float(ctx.attr("dropout_prob"))
    if not 0.0 <= p <= 1.0:
        raise ExecutionError(f"op {ctx.index} (dropout): dropout_prob must be in [0, 1], got {p}")
    upscale = ctx.attr("dropout_implementation") == "upscale_in_train"
    if ctx.attr("is_test"):
        # the identity hands X on (nothing writes into it before it is recomputed)
        ctx.set_output("Out", x if upscale else x * np.asarray(1.0 - p, x.dtype))
        return
    rng = (np.random.default_rng(int(ctx.attr("seed"))) if ctx.attr("fix_seed")
           else ctx.rng())
    mask = ctx.buffer("Mask", x.shape, np.uint8)
    np.greater_equal(rng.random(x.shape, dtype=np.float32), p, out=mask)
    out = ctx.buffer("Out", x.shape, x.dtype)
    np.multiply(x, mask, out=out)
    scale = _keep_scale(ctx)
    if scale != 1.0:
        out *= scale
    ctx.set_output("Mask", mask)
    ctx.set_output("Out", out)


def _infer_dropout_grad(ctx) -> None:
    ctx.set_output("X@GRAD", ctx.input_shape("Mask"), ctx.input_dtype("Out@GRAD"))


@register_op("dropout_grad", inputs=["Mask", "Out@GRAD"], outputs=["X@GRAD"],
             attrs=_DROPOUT_ATTRS, infer_shape=_infer_dropout_grad)
def _dropout_grad(ctx) -> None:
    mask, dout = ctx.input("Mask"), ctx.input("Out@GRAD")
    dx = ctx.buffer("X@GRAD", dout.shape, dout.dtype)
    np.multiply(dout, mask, out=dx)
    scale = _keep_scale(ctx)
    if scale != 1.0:
        dx *= scale
    ctx.set_output("X@GRAD", dx)


# lookup_table_v2: Out[..., :] = W[Ids[...], :]; rows of padding_idx are zero ---------------
_LOOKUP_ATTRS = {"padding_idx": -1, "is_sparse": False}


def _infer_lookup(ctx) -> None:
    if np.dtype(ctx.input_dtype("Ids")).kind not in "iu":
        raise ProgramError(f"op {ctx.op.type!r}: Ids must be integers (int64), got "
                           f"{ctx.input_dtype('Ids')}")
    w = ctx.input_shape("W")
    ctx.set_output("Out", (*ctx.input_shape("Ids"), w[-1]), ctx.input_dtype("W"))


def _ids(ctx, vocab: int) -> np.ndarray:
    ids = ctx.input("Ids")
    if ids.dtype.kind not in "iu":
        raise ExecutionError(f"op {ctx.index} ({ctx.op.type}): Ids must be integers, "
                             f"got {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)].ravel()[0]
        raise ExecutionError(f"op {ctx.index} ({ctx.op.type}): id {int(bad)} is out of range "
                             f"for a table of {vocab} rows")
    return ids


@register_op("lookup_table_v2", inputs=["W", "Ids"], outputs=["Out"], attrs=_LOOKUP_ATTRS,
             infer_shape=_infer_lookup,
             grad=make_grad_op("lookup_table_v2_grad", fwd_inputs=["W", "Ids"],
                               in_grads=["W"]))
def _lookup_table_v2(ctx) -> None:
    w = ctx.input("W")
    ids = _ids(ctx, w.shape[0])
    out = ctx.buffer("Out", (*ids.shape, w.shape[1]), w.dtype)
    np.take(w, ids, axis=0, out=out, mode="clip")   # ids were checked: clip never applies
    pad = int(ctx.attr("padding_idx"))
    if pad != -1:
        out[ids == pad] = 0
    ctx.set_output("Out", out)


@register_op("lookup_table_v2_grad", inputs=["W", "Ids", "Out@GRAD"], outputs=["W@GRAD"],
             attrs=_LOOKUP_ATTRS, infer_shape=like_inputs(("W", "W@GRAD")))
def _lookup_table_v2_grad(ctx) -> None:
    w = ctx.input("W")
    ids = _ids(ctx, w.shape[0]).reshape(-1)
    dout = ctx.input("Out@GRAD").reshape(-1, w.shape[1])
    dw = ctx.buffer("W@GRAD", w.shape, dout.dtype)
    dw.fill(0)
    np.add.at(dw, ids, dout)             # dense scatter-add: repeated ids accumulate
    pad = int(ctx.attr("padding_idx"))
    if pad != -1:
        dw[pad] = 0
    ctx.set_output("W@GRAD", dw)
