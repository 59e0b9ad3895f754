"""softmax_with_cross_entropy (Logits, Label -> Softmax, Loss), as Paddle's: hard int64
labels of shape [N] or [N, 1] (or soft float labels), loss [N, 1], ``ignore_index`` rows
give zero loss and zero gradient. Computed from shifted logits, so it never overflows."""

from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, ProgramError
from ..framework.registry import make_grad_op, register_op
from ._shapes import like_inputs, norm_axis

_ATTRS = {"soft_label": False, "ignore_index": -100, "axis": -1, "numeric_stable_mode": True,
          "use_softmax": True}


def _loss_shape(shape, axis: int) -> tuple[int, ...]:
    return tuple(1 if i == axis else d for i, d in enumerate(shape))


def _fits(shape, want) -> bool:
    return len(shape) == len(want) and all(-1 in (a, b) or a == b for a, b in zip(shape, want))


def _check_label(ctx, shape, axis: int) -> None:
    """Hard labels: integers, one per row (the loss's shape, or it without the class
    dim); soft labels: a distribution shaped like Logits, of its dtype."""
    label, dtype = ctx.input_shape("Label"), ctx.input_dtype("Label")
    if ctx.attr("soft_label"):
        wanted, ok = f"{ctx.input_dtype('Logits')}{list(shape)} like Logits", (
            _fits(label, shape) and dtype == ctx.input_dtype("Logits"))
    else:
        loss = _loss_shape(shape, axis)
        rows = loss[:axis] + loss[axis + 1:]
        wanted = f"int64 (or int32) {list(loss)} or {list(rows)}"
        ok = np.dtype(dtype).kind in "iu" and (_fits(label, loss) or _fits(label, rows))
    if not ok:
        raise ProgramError(f"op {ctx.op.type!r}: Label is {dtype}{list(label)}; with "
                           f"soft_label={bool(ctx.attr('soft_label'))} and Logits "
                           f"{list(shape)} it must be {wanted}")


def _infer(ctx) -> None:
    shape, dtype = ctx.input_shape("Logits"), ctx.input_dtype("Logits")
    axis = norm_axis(int(ctx.attr("axis")), len(shape), ctx)
    _check_label(ctx, shape, axis)
    ctx.set_output("Softmax", shape, dtype)
    ctx.set_output("Loss", _loss_shape(shape, axis), dtype)


def _hard_labels(ctx, label: np.ndarray, shape, axis: int):
    """(class index per row shaped like the loss, mask of ignored rows or None)."""
    loss_shape = _loss_shape(shape, axis)
    if label.size != int(np.prod(loss_shape)):
        raise ExecutionError(
            f"op {ctx.index} ({ctx.op.type}): Label of shape {list(label.shape)} does not "
            f"match Logits {list(shape)}: expected one class index per row, shape "
            f"{list(loss_shape)} or without the class dim")
    idx = label.reshape(loss_shape).astype(np.int64, copy=False)
    n_classes, ignore = shape[axis], int(ctx.attr("ignore_index"))
    lo, hi = (int(idx.min()), int(idx.max())) if idx.size else (0, 0)
    ignored = None
    if lo <= ignore <= hi:
        ignored = idx == ignore
        idx = np.where(ignored, 0, idx)
        lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= n_classes:
        bad = lo if lo < 0 else hi
        raise ExecutionError(
            f"op {ctx.index} ({ctx.op.type}): label {bad} is out of range for "
            f"{n_classes} classes (ignore_index={ignore})")
    return idx, ignored


@register_op("softmax_with_cross_entropy", inputs=["Logits", "Label"],
             outputs=["Softmax", "Loss"], attrs=_ATTRS, infer_shape=_infer,
             grad=make_grad_op("softmax_with_cross_entropy_grad", fwd_inputs=["Label"],
                               fwd_outputs=["Softmax"], out_grads=["Loss"],
                               in_grads=["Logits"]))
def _softmax_with_cross_entropy(ctx) -> None:
    logits, label = ctx.input("Logits"), ctx.input("Label")
    axis = norm_axis(int(ctx.attr("axis")), logits.ndim)
    sm = ctx.buffer("Softmax", logits.shape, logits.dtype)
    np.subtract(logits, logits.max(axis=axis, keepdims=True), out=sm)   # shifted logits
    if ctx.attr("soft_label"):
        label = label.astype(logits.dtype, copy=False)
        picked = np.sum(label * sm, axis=axis, keepdims=True)
        weight = label.sum(axis=axis, keepdims=True)
        ignored = None
    else:
        idx, ignored = _hard_labels(ctx, label, logits.shape, axis)
        picked = np.take_along_axis(sm, idx, axis)
        weight = None
    np.exp(sm, out=sm)
    total = sm.sum(axis=axis, keepdims=True)
    sm /= total
    # loss = -log softmax[label] = log(sum exp(shifted)) - shifted[label]
    log_total = np.log(total)
    if weight is not None:
        log_total *= weight
    loss = ctx.buffer("Loss", total.shape, logits.dtype)
    np.subtract(log_total, picked, out=loss)
    if ignored is not None:
        loss[ignored] = 0
    ctx.set_output("Softmax", sm)
    ctx.set_output("Loss", loss)


@register_op("softmax_with_cross_entropy_grad", inputs=["Label", "Softmax", "Loss@GRAD"],
             outputs=["Logits@GRAD"], attrs=_ATTRS,
             infer_shape=like_inputs(("Softmax", "Logits@GRAD")))
def _softmax_with_cross_entropy_grad(ctx) -> None:
    label, sm, dloss = ctx.input("Label"), ctx.input("Softmax"), ctx.input("Loss@GRAD")
    axis = norm_axis(int(ctx.attr("axis")), sm.ndim)
    dx = ctx.buffer("Logits@GRAD", sm.shape, sm.dtype)
    if ctx.attr("soft_label"):
        np.subtract(sm, label, out=dx)               # d/dlogits = softmax - label
        dx *= dloss.reshape(_loss_shape(sm.shape, axis))
        ctx.set_output("Logits@GRAD", dx)
        return
    idx, ignored = _hard_labels(ctx, label, sm.shape, axis)
    np.copyto(dx, sm)
    np.put_along_axis(dx, idx, np.take_along_axis(sm, idx, axis) - 1, axis)
    dx *= dloss.reshape(_loss_shape(sm.shape, axis))
    if ignored is not None:
        dx *= ~ignored
    ctx.set_output("Logits@GRAD", dx)
