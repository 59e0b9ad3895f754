"""The vocabulary-parallel ops of tensor parallelism: ``c_embedding`` (rows of this rank's
shard of the table) and ``c_softmax_with_cross_entropy`` (cross entropy over logits whose
classes are split over the ring), with their grads."""

from __future__ import annotations

import numpy as np

from ..distributed.collective.reduce_op import ReduceOp
from ..errors import ExecutionError, ProgramError
from ..framework.registry import make_grad_op
from ._shapes import like_inputs
from .collective import _INDEX_DTYPES, _check_rank_attrs, _check_ring_size, _register, _ring

# c_embedding: rows of this rank's vocabulary shard; ids outside it give zero rows ------------
_EMBEDDING_ATTRS = {"start_index": 0, "vocab_size": -1}   # vocab_size: recorded, as Paddle


def _infer_c_embedding(ctx) -> None:
    w, dtype = ctx.input_shape("W"), ctx.input_dtype("Ids")
    if len(w) != 2:
        raise ProgramError(f"op {ctx.op.type!r}: W must be [height, width], got {list(w)}")
    if dtype not in _INDEX_DTYPES:
        raise ProgramError(f"op {ctx.op.type!r}: Ids must be int32 or int64, got {dtype}")
    if int(ctx.attr("start_index")) < 0:
        raise ProgramError(f"op {ctx.op.type!r}: start_index={ctx.attr('start_index')} "
                           f"must be >= 0")
    ctx.set_output("Out", (*ctx.input_shape("Ids"), w[1]), ctx.input_dtype("W"))


def _shard_rows(ctx, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of W for each id, mask of the ids that fall in this shard), both flat."""
    ids = ctx.input("Ids")
    if ids.dtype.name not in _INDEX_DTYPES:
        raise ExecutionError(f"Ids must be int32 or int64, got {ids.dtype}")
    if w.ndim != 2 or 0 in w.shape:
        raise ExecutionError(f"W must be a non-empty [height, width] table, got "
                             f"{list(w.shape)}")
    local = ids.reshape(-1).astype(np.int64) - int(ctx.attr("start_index"))
    hit = (local >= 0) & (local < w.shape[0])
    return np.where(hit, local, 0), hit


@_register("c_embedding", inputs=["W", "Ids"], outputs=["Out"], attrs=_EMBEDDING_ATTRS,
           infer_shape=_infer_c_embedding,
           grad=make_grad_op("c_embedding_grad", fwd_inputs=["W", "Ids"], in_grads=["W"]))
def _c_embedding(ctx) -> None:
    w = ctx.input("W")
    rows, hit = _shard_rows(ctx, w)
    out = ctx.buffer("Out", (*ctx.input("Ids").shape, w.shape[1]), w.dtype)
    flat = out.reshape(-1, w.shape[1])
    np.take(w, rows, axis=0, out=flat)
    flat[~hit] = 0
    ctx.set_output("Out", out)


@_register("c_embedding_grad", inputs=["W", "Ids", "Out@GRAD"], outputs=["W@GRAD"],
           attrs=_EMBEDDING_ATTRS, infer_shape=like_inputs(("W", "W@GRAD")))
def _c_embedding_grad(ctx) -> None:
    w = ctx.input("W")
    rows, hit = _shard_rows(ctx, w)
    dout = ctx.input("Out@GRAD").reshape(-1, w.shape[1])
    dw = ctx.buffer("W@GRAD", w.shape, dout.dtype)
    dw.fill(0)
    np.add.at(dw, rows[hit], dout[hit])     # repeated ids accumulate
    ctx.set_output("W@GRAD", dw)


# c_softmax_with_cross_entropy: cross entropy over the classes of every rank's Logits shard,
# Logits [N..., D] (rank r holds classes [r D, (r+1) D)), Label [N..., 1]; Loss is replicated.
_XENT_ATTRS = {"ring_id": 0, "rank": 0, "nranks": 1, "ignore_index": -100}


def _infer_c_xent(ctx) -> None:
    _check_rank_attrs(ctx)
    logits, label = ctx.input_shape("Logits"), ctx.input_shape("Label")
    want = (*logits[:-1], 1)
    fits = len(label) == len(want) and all(-1 in (a, b) or a == b for a, b in zip(label, want))
    if not logits or not fits or ctx.input_dtype("Label") not in _INDEX_DTYPES:
        raise ProgramError(f"op {ctx.op.type!r}: Label is {ctx.input_dtype('Label')}"
                           f"{list(label)}; with Logits {list(logits)} it must be int64 (or "
                           f"int32) {list(want)}")
    ctx.set_output("Softmax", logits, ctx.input_dtype("Logits"))
    ctx.set_output("Loss", want, ctx.input_dtype("Logits"))


def _labels(ctx, label: np.ndarray, rows: int, d: int, nranks: int):
    """(class per row as int64, mask of ignored rows), after checking every label names a
    class of some shard or is ignore_index. Runs before any collective: every rank raises."""
    if label.dtype.name not in _INDEX_DTYPES or label.size != rows:
        raise ExecutionError(f"Label is {label.dtype}{list(label.shape)}; expected int64 (or "
                             f"int32) with one class per row ({rows} rows)")
    idx = label.reshape(rows).astype(np.int64)
    ignore = int(ctx.attr("ignore_index"))
    ignored = idx == ignore
    bad = ~ignored & ((idx < 0) | (idx >= d * nranks))
    if bad.any():
        raise ExecutionError(f"label {int(idx[bad][0])} is out of range: the {nranks} shards "
                             f"of {d} classes hold classes 0..{d * nranks - 1} "
                             f"(ignore_index={ignore})")
    return idx, ignored


def _in_shard(idx: np.ndarray, ignored: np.ndarray, rank: int, d: int):
    """(rows whose class is in this shard, that class's column in the shard)."""
    local = idx - rank * d
    mine = np.flatnonzero(~ignored & (local >= 0) & (local < d))
    return mine, local[mine]


@_register("c_softmax_with_cross_entropy", inputs=["Logits", "Label"],
           outputs=["Softmax", "Loss"], attrs=_XENT_ATTRS, infer_shape=_infer_c_xent,
           grad=make_grad_op("c_softmax_with_cross_entropy_grad", fwd_inputs=["Label"],
                             fwd_outputs=["Softmax"], out_grads=["Loss"],
                             in_grads=["Logits"]))
def _c_softmax_with_cross_entropy(ctx) -> None:
    comm = _ring(ctx)
    _check_ring_size(ctx, comm)
    logits = ctx.input("Logits")
    d = logits.shape[-1] if logits.ndim else 0
    if d == 0:
        raise ExecutionError(f"Logits {list(logits.shape)} must have a non-empty class dim")
    rows = logits.size // d
    idx, ignored = _labels(ctx, ctx.input("Label"), rows, d, comm.nranks)
    x = logits.reshape(rows, d)
    top = x.max(axis=1)
    comm.all_reduce(top, ReduceOp.MAX)                   # the global row max
    sm = ctx.buffer("Softmax", logits.shape, logits.dtype)
    shifted = sm.reshape(rows, d)
    np.subtract(x, top[:, None], out=shifted)
    # [target logit, sum of exp] per row: one all-reduce for both; the target is non-zero
    # only on the rank whose shard holds the label.
    both = np.zeros((2, rows), logits.dtype)
    mine, cols = _in_shard(idx, ignored, comm.rank, d)
    both[0, mine] = shifted[mine, cols]
    np.exp(shifted, out=shifted)
    np.sum(shifted, axis=1, out=both[1])
    comm.all_reduce(both, ReduceOp.SUM)
    # Every rank now holds the same bytes in `both`, so the same Loss.
    loss = ctx.buffer("Loss", (*logits.shape[:-1], 1), logits.dtype)
    flat_loss = loss.reshape(rows)
    np.subtract(np.log(both[1]), both[0], out=flat_loss)
    flat_loss[ignored] = 0
    shifted /= both[1][:, None]
    ctx.set_output("Softmax", sm)
    ctx.set_output("Loss", loss)


@_register("c_softmax_with_cross_entropy_grad", inputs=["Softmax", "Label", "Loss@GRAD"],
           outputs=["Logits@GRAD"], attrs=_XENT_ATTRS,
           infer_shape=like_inputs(("Softmax", "Logits@GRAD")))
def _c_softmax_with_cross_entropy_grad(ctx) -> None:
    # dLoss/dLogits = softmax - onehot(label), restricted to this shard: no communication.
    sm, dloss = ctx.input("Softmax"), ctx.input("Loss@GRAD")
    rank, nranks = int(ctx.attr("rank")), int(ctx.attr("nranks"))
    d = sm.shape[-1]
    rows = sm.size // d if d else 0
    idx, ignored = _labels(ctx, ctx.input("Label"), rows, d, nranks)
    dx = ctx.buffer("Logits@GRAD", sm.shape, sm.dtype)
    np.copyto(dx, sm)
    flat = dx.reshape(rows, d)
    mine, cols = _in_shard(idx, ignored, rank, d)
    flat[mine, cols] -= 1
    flat *= dloss.reshape(rows, 1)
    flat[ignored] = 0
    ctx.set_output("Logits@GRAD", dx)
