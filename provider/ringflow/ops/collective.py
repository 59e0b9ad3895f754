"""Collective program ops (Paddle's legacy c_* ops): ring setup, all-reduce, broadcast,
all-gather and the tensor-parallel pairs; ``parallel_nn`` holds the vocabulary-parallel
embedding and cross entropy built on the helpers here."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..distributed.collective.reduce_op import ReduceOp
from ..errors import ConfigError, ExecutionError, ProgramError, RingflowError
from ..framework.registry import (
    OpDesc,
    get_op_def,
    grad_var_name,
    make_grad_op,
    register_op,
    same_shape_as,
)
from ._shapes import like_inputs

if TYPE_CHECKING:
    from ..distributed.collective.communicator import Communicator

# Gradients follow Megatron-LM: a value is rank-local or replicated (one value that every rank
# holds), so c_identity (replicated in, local out) has an all-reduce as its gradient and
# mp_allreduce_sum (local in, replicated out) the identity. test_collective_ops.py states the
# convention exactly.

_INDEX_DTYPES = ("int32", "int64")


def _register(op_type: str, **spec: Any) -> Callable:
    """``register_op``, with the op's index and type put in front of every ringflow error the
    kernel raises: the executor passes those on unchanged, and the communicator's errors name
    only the rank and the ring."""

    def wrap(kernel: Callable) -> Callable:
        @functools.wraps(kernel)
        def named(ctx) -> None:
            try:
                kernel(ctx)
            except RingflowError as exc:
                raise type(exc)(f"op {ctx.index} ({ctx.op.type}): {exc}") from exc

        register_op(op_type, **spec)(named)
        return kernel

    return wrap


def _rings():
    # imported when a collective op first runs: building and running other programs does
    # not load the transports
    from ..distributed.collective import registry

    return registry


def _ring(ctx) -> Communicator:
    return _rings().get_ring(int(ctx.attr("ring_id")))


def _check_ring_size(ctx, comm: Communicator, with_rank: bool = True) -> None:
    """The rank/nranks attrs fixed shapes and shards when the program was built; a ring of
    another size (or this process at another rank) would silently compute something else."""
    nranks = int(ctx.attr("nranks"))
    rank = int(ctx.attr("rank")) if with_rank else comm.rank
    if (rank, nranks) != (comm.rank, comm.nranks):
        said = f"rank={rank}, nranks={nranks}" if with_rank else f"nranks={nranks}"
        raise ExecutionError(f"attrs {said} disagree with ring {comm.ring_id}, where this "
                             f"process is rank {comm.rank} of {comm.nranks}")


def _check_rank_attrs(ctx, with_rank: bool = True) -> tuple[int, int]:
    """Build-time check of the rank/nranks attrs; returns them."""
    nranks = int(ctx.attr("nranks"))
    rank = int(ctx.attr("rank")) if with_rank else 0
    if nranks < 1 or not 0 <= rank < nranks:
        raise ProgramError(f"op {ctx.op.type!r}: attrs rank={rank}, nranks={nranks} must "
                           f"satisfy nranks >= 1 and 0 <= rank < nranks")
    return rank, nranks


def _times(d: int, n: int) -> int:
    return -1 if d == -1 else d * n


def _grad_as(grad_type: str):
    """Grad maker of an op whose gradient is another X -> Out op on the same ring:
    X = Out@GRAD, Out = X@GRAD, with the forward attrs that ``grad_type`` has."""

    def maker(op, no_grad: frozenset) -> list[OpDesc]:
        x = op.inputs["X"][0]
        if x in no_grad:
            return []
        keep = get_op_def(grad_type).attrs
        attrs = {k: v for k, v in op.attrs.items() if k in keep}
        return [OpDesc(grad_type, {"X": [grad_var_name(op.outputs["Out"][0])]},
                       {"Out": [grad_var_name(x)]}, attrs)]

    return maker


def _out_holding_x(ctx) -> np.ndarray:
    """Out's array, holding X's values, for a collective that works in place: X's own array
    when X is Out and the executor allocated it, else a buffer with a copy of X. So an array
    that another variable (or the user's feed) also holds is never changed."""
    x = ctx.input("X")
    out = ctx.buffer("Out", x.shape, x.dtype)
    if out is not x:
        np.copyto(out, x)
    return out


# c_comm_init: create ring ring_id among endpoints (one per ring rank) -----------------------


@_register("c_comm_init", inputs=[], outputs=[],
           attrs={"ring_id": 0, "nranks": 1, "rank": 0, "endpoints": "",
                  "use_hierarchical_allreduce": -1})
def _c_comm_init(ctx) -> None:
    """``use_hierarchical_allreduce`` (fleet's strategy option when the script set it): 1
    all-reduces in two levels where a host has several ranks of the ring, 0 in one flat
    ring, -1 as RINGFLOW_TWO_LEVEL says (default: two levels)."""
    ring_id, rank, nranks = (int(ctx.attr(k)) for k in ("ring_id", "rank", "nranks"))
    program_ids = _rings().PROGRAM_RING_IDS
    text = str(ctx.attr("endpoints"))
    endpoints = [e.strip() for e in text.split(",") if e.strip()]
    if ring_id not in program_ids:
        raise ConfigError(f"ring_id={ring_id}: program ops own rings {program_ids.start}-"
                          f"{program_ids.stop - 1} (the Python API's groups use "
                          f"{program_ids.stop} and up)")
    if len(endpoints) != nranks or not 0 <= rank < nranks:
        raise ConfigError(f"ring {ring_id}: rank={rank}, nranks={nranks}, endpoints={text!r} "
                          f"({len(endpoints)} endpoints) do not fit: expected one endpoint per "
                          f"rank and 0 <= rank < nranks")
    # init_ring returns the existing ring for the same members: a startup program may rerun
    hierarchical = int(ctx.attr("use_hierarchical_allreduce"))
    _rings().init_ring(ring_id, endpoints, rank, nranks,
                       two_level=None if hierarchical < 0 else bool(hierarchical))


# all-reduce and broadcast: X -> Out, in place when Out is X ---------------------------------
_ALLREDUCE_ATTRS = {"ring_id": 0, "use_calc_stream": True, "use_model_parallel": False}
_MP_ATTRS = {"ring_id": 0, "use_calc_stream": True, "use_model_parallel": True}


def _all_reduce_kernel(reduce_op: int) -> Callable:
    def kernel(ctx) -> None:
        comm = _ring(ctx)
        out = _out_holding_x(ctx)
        comm.all_reduce(out, reduce_op)
        ctx.set_output("Out", out)

    return kernel


# The data-parallel convention: every rank's loss counts, so dX = sum of every rank's dOut.
for _type, _reduce_op in (("c_allreduce_sum", ReduceOp.SUM), ("c_allreduce_max", ReduceOp.MAX),
                          ("c_allreduce_min", ReduceOp.MIN), ("c_allreduce_prod", ReduceOp.PROD)):
    _register(_type, inputs=["X"], outputs=["Out"], attrs=_ALLREDUCE_ATTRS,
              infer_shape=same_shape_as(),
              grad=_grad_as("c_allreduce_sum") if _reduce_op == ReduceOp.SUM else None,
              )(_all_reduce_kernel(_reduce_op))

# Partial sums (local) in, the replicated sum out: the gradient passes through unchanged.
_register("mp_allreduce_sum", inputs=["X"], outputs=["Out"], attrs=_MP_ATTRS,
          infer_shape=same_shape_as(), grad=_grad_as("c_identity"),
          )(_all_reduce_kernel(ReduceOp.SUM))


# c_reduce_sum: the sum over the ring lands on ring rank root_id; the others keep X (Paddle's
# op). Sharding reduces each gradient to the rank that updates its parameter; the executor
# turns a run of them into one reduce-scatter of a gradient bucket (compiler/buckets.py).
# ``sharding_stage`` (ringflow's): 2 lets the executor keep only the owner's reduced part.
@_register("c_reduce_sum", inputs=["X"], outputs=["Out"],
           attrs={"ring_id": 0, "root_id": 0, "use_calc_stream": True, "sharding_stage": 0},
           infer_shape=same_shape_as())
def _c_reduce_sum(ctx) -> None:
    comm = _ring(ctx)
    out = _out_holding_x(ctx)
    comm.reduce(out, int(ctx.attr("root_id")), ReduceOp.SUM)
    ctx.set_output("Out", out)


@_register("broadcast", inputs=["X"], outputs=["Out"],
           attrs={"ring_id": 0, "root": 0, "use_calc_stream": True}, infer_shape=same_shape_as())
def _broadcast(ctx) -> None:
    comm = _ring(ctx)
    out = _out_holding_x(ctx)
    comm.broadcast(out, int(ctx.attr("root")))
    ctx.set_output("Out", out)


# c_identity: a replicated X enters the model-parallel region, where every rank uses its copy
# differently; the gradient is therefore the sum of every rank's.


@_register("c_identity", inputs=["X"], outputs=["Out"], attrs=_MP_ATTRS,
           infer_shape=same_shape_as(), grad=_grad_as("c_allreduce_sum"))
def _c_identity(ctx) -> None:
    _ring(ctx)  # fails here, not in the backward, when the ring is missing
    ctx.set_output("Out", _out_holding_x(ctx))


# Stream barriers: the collectives here are synchronous, so both are the identity.


@_register("c_sync_calc_stream", inputs=["X"], outputs=["Out"], attrs={},
           infer_shape=same_shape_as())
def _c_sync_calc_stream(ctx) -> None:
    # Paddle's op has no ring (it waits for the compute stream), so none is looked up.
    ctx.set_output("Out", ctx.input("X"))


def _infer_sync_comm(ctx) -> None:
    ins, outs = len(ctx.input_names("X")), len(ctx.op.outputs.get("Out", ()))
    if ins != outs:
        raise ProgramError(f"op {ctx.op.type!r}: X has {ins} variables but Out {outs}; Out "
                           f"must be X, one by one")
    like_inputs(("X", "Out"))(ctx)


@_register("c_sync_comm_stream", inputs=["X*"], outputs=["Out*"], attrs={"ring_id": 0},
           infer_shape=_infer_sync_comm)
def _c_sync_comm_stream(ctx) -> None:
    _ring(ctx)
    ctx.set_outputs("Out", ctx.inputs("X"))


# c_allgather: every rank's X stacked along axis 0 in ring-rank order (a replicated Out) --------
_ALLGATHER_ATTRS = {"ring_id": 0, "nranks": 1, "use_calc_stream": True}


def _infer_allgather(ctx) -> None:
    _, nranks = _check_rank_attrs(ctx, with_rank=False)
    shape = ctx.input_shape("X")
    if not shape:
        raise ProgramError(f"op {ctx.op.type!r}: X must have at least one dim")
    ctx.set_output("Out", (_times(shape[0], nranks), *shape[1:]), ctx.input_dtype("X"))


@_register("c_allgather", inputs=["X"], outputs=["Out"], attrs=_ALLGATHER_ATTRS,
           infer_shape=_infer_allgather, grad=make_grad_op("c_allgather_grad"))
def _c_allgather(ctx) -> None:
    comm = _ring(ctx)
    _check_ring_size(ctx, comm, with_rank=False)
    x = ctx.input("X")
    if x.ndim == 0:
        raise ExecutionError("X must have at least one dim, got a scalar")
    out = ctx.buffer("Out", (x.shape[0] * comm.nranks, *x.shape[1:]), x.dtype)
    np.concatenate(comm.all_gather(x), axis=0, out=out)
    ctx.set_output("Out", out)


def _infer_allgather_grad(ctx) -> None:
    _, nranks = _check_rank_attrs(ctx, with_rank=False)
    shape = ctx.input_shape("Out@GRAD")
    if shape[0] != -1 and shape[0] % nranks:
        raise ProgramError(f"op {ctx.op.type!r}: Out@GRAD has {shape[0]} rows, not a multiple "
                           f"of nranks={nranks}")
    rows = -1 if shape[0] == -1 else shape[0] // nranks
    ctx.set_output("X@GRAD", (rows, *shape[1:]), ctx.input_dtype("Out@GRAD"))


@_register("c_allgather_grad", inputs=["Out@GRAD"], outputs=["X@GRAD"],
           attrs=_ALLGATHER_ATTRS, infer_shape=_infer_allgather_grad)
def _c_allgather_grad(ctx) -> None:
    # Out is replicated (the loss is computed once from it), so dX is this rank's rows of dOut.
    comm = _ring(ctx)
    _check_ring_size(ctx, comm, with_rank=False)
    dout = ctx.input("Out@GRAD")
    rows = dout.shape[0] // comm.nranks
    dx = ctx.buffer("X@GRAD", (rows, *dout.shape[1:]), dout.dtype)
    np.copyto(dx, dout[comm.rank * rows:(comm.rank + 1) * rows])
    ctx.set_output("X@GRAD", dx)


# c_concat / c_split: the last axis, gathered from or split into the ring's ranks --------------
_SPLIT_ATTRS = {"ring_id": 0, "rank": 0, "nranks": 1, "use_calc_stream": True,
                "use_model_parallel": True}


def _infer_concat(ctx) -> None:
    _, nranks = _check_rank_attrs(ctx)
    shape = ctx.input_shape("X")
    if not shape:
        raise ProgramError(f"op {ctx.op.type!r}: X must have at least one dim")
    ctx.set_output("Out", (*shape[:-1], _times(shape[-1], nranks)), ctx.input_dtype("X"))


def _infer_split(ctx) -> None:
    _, nranks = _check_rank_attrs(ctx)
    shape = ctx.input_shape("X")
    if not shape:
        raise ProgramError(f"op {ctx.op.type!r}: X must have at least one dim")
    d = shape[-1]
    if d != -1 and d % nranks:
        raise ProgramError(f"op {ctx.op.type!r}: the last dim D={d} of X is not divisible "
                           f"by nranks={nranks}")
    ctx.set_output("Out", (*shape[:-1], -1 if d == -1 else d // nranks), ctx.input_dtype("X"))


@_register("c_concat", inputs=["X"], outputs=["Out"], attrs=_SPLIT_ATTRS,
           infer_shape=_infer_concat, grad=_grad_as("c_split"))
def _c_concat(ctx) -> None:
    comm = _ring(ctx)
    _check_ring_size(ctx, comm)
    x = ctx.input("X")
    if x.ndim == 0:
        raise ExecutionError("X must have at least one dim, got a scalar")
    out = ctx.buffer("Out", (*x.shape[:-1], x.shape[-1] * comm.nranks), x.dtype)
    np.concatenate(comm.all_gather(x), axis=-1, out=out)
    ctx.set_output("Out", out)


# The gradient of c_split is c_concat (last axis), not Paddle's c_allgather along axis 0.
@_register("c_split", inputs=["X"], outputs=["Out"], attrs=_SPLIT_ATTRS,
           infer_shape=_infer_split, grad=_grad_as("c_concat"))
def _c_split(ctx) -> None:
    comm = _ring(ctx)
    _check_ring_size(ctx, comm)
    x = ctx.input("X")
    if x.ndim == 0:
        raise ExecutionError("X must have at least one dim, got a scalar")
    d = x.shape[-1]
    if d % comm.nranks:
        raise ExecutionError(f"the last dim D={d} of X is not divisible by nranks="
                             f"{comm.nranks}")
    width = d // comm.nranks
    out = ctx.buffer("Out", (*x.shape[:-1], width), x.dtype)
    np.copyto(out, x[..., comm.rank * width:(comm.rank + 1) * width])
    ctx.set_output("Out", out)
