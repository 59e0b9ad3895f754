"""Gradient buckets (Paddle's ``fuse_all_reduce_ops`` / ``fuse_grad_size_in_MB``).

TensorParallelOptimizer all-reduces every parameter gradient on its own over the
data-parallel ring (``c_sync_calc_stream``, ``c_allreduce_sum`` per gradient, one
``c_sync_comm_stream`` before the optimizer); ShardingOptimizer reduces each to the rank
that owns its parameter instead (``c_reduce_sum`` with ``root_id``, owners in rank order
along the gradients). ``extract`` takes those ops out; ``place``
gathers the gradients, in the order they were all-reduced (backward order), into buckets of
one dtype and at most ``fuse_grad_size_in_MB``. A bucket is one flat buffer whose views are
the gradients' arrays, so the grad kernels write into it and nothing is copied in or out.
Its launch step comes right after the last write of its last gradient, and all-reduces the
buffer (on the ring's communication thread when it overlaps); its wait step comes before the
first op that uses one of its gradients (the optimizer waits for exactly the buckets it
reads), and ``c_sync_comm_stream`` waits for all of the ring's buckets. A bucket of
reductions is one ``reduce_scatter_v`` of its buffer: each owner's gradients are one range.

Sums of two ranks are bitwise those of per-gradient all-reduces (a + b == b + a); with more
ranks the order of a chunk's additions depends on where the chunk falls in the buffer, so
the results agree within rounding (and stay bitwise equal across ranks).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..distributed.shard_layout import shard_bounds
from ..framework.program import Operator
from ..framework.roles import OP_ROLE_KEY, OpRole
from . import grad_shards
from .build_strategy import BuildStrategy
from .comm_stream import CommStream, Handle
from .steps import Step

_SYNC_CALC, _ALLREDUCE, _SYNC_COMM = "c_sync_calc_stream", "c_allreduce_sum", "c_sync_comm_stream"
_REDUCE = "c_reduce_sum"
ALL = -1   # the root of a gradient that every rank gets (all-reduced)


@dataclass
class Pending:
    """What ``extract`` took out: per ring, (gradient, program index of its collective, the
    rank it is reduced to or ALL)."""

    grads: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)
    stage: dict[int, int] = field(default_factory=dict)   # sharding stage per ring


def _is_grad_allreduce(op: Operator, block) -> bool:
    if op.type not in (_ALLREDUCE, _REDUCE) or op.input("X") != op.output("Out"):
        return False
    if not int(op.attr(OP_ROLE_KEY) or 0) & OpRole.Backward:
        return False
    name = op.input("X")[0]
    param = block._find_var_recursive(name[:-len("@GRAD")]) if name.endswith("@GRAD") else None
    return param is not None and getattr(param, "trainable", False)


def _root(op: Operator) -> int:
    return int(op.attr("root_id")) if op.type == _REDUCE else ALL


def extract(steps: list[Step]) -> tuple[list[Step], Pending | None]:
    """The steps without the per-gradient all-reduces (and the c_sync_calc_stream before
    them, an identity); None when there are none."""
    if not steps:
        return steps, None
    block = steps[0].op.block
    pending, grads = Pending(), set()
    for step in steps:
        if _is_grad_allreduce(step.op, block):
            ring = int(step.op.attr("ring_id"))
            pending.grads.setdefault(ring, []).append((step.op.input("X")[0], step.index,
                                                       _root(step.op)))
            pending.stage[ring] = int(step.op.attr("sharding_stage") or 0)
            grads.add(step.op.input("X")[0])
    if not grads:
        return steps, None
    kept = [s for s in steps if not (_is_grad_allreduce(s.op, block) or (
        s.op.type == _SYNC_CALC and s.op.input("X")[0] in grads))]
    return kept, pending


def place(steps: list[Step], pending: Pending, block,
          strategy: BuildStrategy) -> tuple[list[Step], list[Bucket]]:
    """The steps with launch and wait steps for the buckets of every ring."""
    inserts: list[tuple[float, Step]] = []
    buckets: list[Bucket] = []
    for ring, grads in pending.grads.items():
        for bucket in _buckets(steps, block, ring, grads, strategy):
            bucket.stage = pending.stage.get(ring, 0)
            buckets.append(bucket)
            inserts.append((bucket.launch_after + 0.5, bucket.launch_step(block)))
            inserts.append((bucket.wait_before - 0.5, bucket.wait_step(block)))
    grad_shards.assign_pools(buckets, lambda name: _first_write(steps, name))
    for bucket in buckets:   # a staging buffer is written again only once it is reduced
        if bucket.reuse_after is not None:
            inserts.append((bucket.first_write - 0.5, bucket.reuse_after.wait_step(block)))
    out = [(float(pos), s) for pos, s in enumerate(steps) if s.op.type != _SYNC_COMM]
    for pos, step in enumerate(steps):
        if step.op.type == _SYNC_COMM:
            ring = int(step.op.attr("ring_id"))
            mine = [b for b in buckets if b.ring_id == ring]
            out.append((float(pos), _wait_all_step(block, ring, mine, step.index)))
    # stable order: launches after their writer, waits before their reader
    ordered = sorted([*out, *inserts], key=lambda item: item[0])
    return [s for _, s in ordered], buckets


def _buckets(steps: list[Step], block, ring: int, grads: list[tuple[str, int, int]],
             strategy: BuildStrategy) -> list[Bucket]:
    made: list[Bucket] = []
    current: Bucket | None = None
    for name, ar_index, root in grads:
        var = block._find_var_recursive(name)
        shape, dtype = tuple(int(d) for d in var.shape), np.dtype(var.dtype)
        writer = _last_writer_before(steps, name, ar_index)
        user = _first_use_after(steps, name, ar_index)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if current is None or not current.takes(dtype, nbytes, writer, user,
                                                strategy.bucket_bytes, root):
            current = Bucket(ring, len(made), strategy.overlap_comm)
            made.append(current)
        current.add(name, shape, dtype, writer, user, root)
    return made


def _last_writer_before(steps: list[Step], name: str, index: int) -> int:
    found = -1
    for pos, step in enumerate(steps):
        if step.index < index and name in step.op.output_arg_names:
            found = pos
    return found


def _first_write(steps: list[Step], name: str) -> int:
    return next((pos for pos, s in enumerate(steps) if name in s.op.output_arg_names),
                len(steps))


def _first_use_after(steps: list[Step], name: str, index: int) -> int:
    """The first step after the all-reduce that reads or writes the gradient; not a
    c_sync_comm_stream, which becomes a wait for every bucket of its ring anyway."""
    for pos, step in enumerate(steps):
        if step.index > index and step.op.type != _SYNC_COMM and (
                name in step.op.input_arg_names or name in step.op.output_arg_names):
            return pos
    return len(steps)


class Bucket:
    """Gradients of one ring and dtype all-reduced (or reduce-scattered to their owners,
    ``roots``) as one flat buffer."""

    def __init__(self, ring_id: int, number: int, overlap: bool | None) -> None:
        self.ring_id, self.number, self.overlap = ring_id, number, overlap
        self.names: list[str] = []
        self.roots: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtype: np.dtype | None = None
        self.nbytes = 0
        self.launch_after = -1             # step position of the last gradient write
        self.wait_before = 1 << 62         # step position of the first use of a gradient
        # sharding stage 2 (grad_shards.py): a staging buffer shared with ``reuse_after``
        self.stage, self.pool, self.slot, self.reuse_after = 0, None, 0, None
        self.first_write, self.shard = 0, None
        # per scope: the flat buffer and its views; the job in flight
        self._buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._inflight: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def takes(self, dtype: np.dtype, nbytes: int, writer: int, user: int, limit: int,
              root: int = ALL) -> bool:
        """Whether one more gradient fits: same dtype, within the size, its write comes
        before every use of the gradients already in (the launch precedes them), and it is
        all-reduced like them or reduced to the same or a later rank."""
        last = self.roots[-1] if self.roots else root
        # the gradients one step writes stay in one bucket, over the size if need be: a
        # bucket then starts after the launch of the one before (stage 2 reuses buffers)
        fits = self.nbytes + nbytes <= limit or (self.names and writer == self.launch_after)
        return (dtype == self.dtype and bool(fits)
                and writer < self.wait_before and user > self.launch_after
                and (root == ALL) == (last == ALL) and root >= last)

    def add(self, name: str, shape: tuple[int, ...], dtype: np.dtype, writer: int,
            user: int, root: int = ALL) -> None:
        self.roots.append(root)
        self.names.append(name)
        self.shapes.append(shape)
        self.dtype = dtype
        self.nbytes += int(np.prod(shape)) * dtype.itemsize
        self.launch_after = max(self.launch_after, writer)
        self.wait_before = min(self.wait_before, user)

    def __repr__(self) -> str:
        return (f"Bucket(ring {self.ring_id} #{self.number}: {len(self.names)} gradients, "
                f"{self.nbytes} bytes {self.dtype})")

    # steps ---------------------------------------------------------------------------------
    @property
    def scatters(self) -> bool:
        """Whether each gradient goes to its owner (a reduce-scatter) rather than to all."""
        return bool(self.roots) and self.roots[0] != ALL

    def bounds(self, nranks: int) -> list[int]:
        """Where each ring rank's gradients start in the buffer (and the end)."""
        sizes = [int(np.prod(s)) for s in self.shapes]
        return shard_bounds(sizes, self.roots, nranks)

    def launch_step(self, block) -> Step:
        kind = "bucket_reduce_scatter" if self.scatters else "bucket_allreduce"
        op = Operator(block, kind, {"X": list(self.names)},
                      {"Out": list(self.names)},
                      {"ring_id": self.ring_id, "bucket": self.number, "nbytes": self.nbytes,
                       OP_ROLE_KEY: int(OpRole.Backward)})
        return Step(op, self.launch, -1)

    def wait_step(self, block) -> Step:
        op = Operator(block, "bucket_wait", {"X": list(self.names)}, {"Out": list(self.names)},
                      {"ring_id": self.ring_id, "bucket": self.number,
                       OP_ROLE_KEY: int(OpRole.Backward)})
        return Step(op, self.wait, -1)

    # kernels -------------------------------------------------------------------------------
    def launch(self, ctx) -> None:
        from ..distributed.collective.registry import get_ring

        self.wait(ctx)  # a job of an earlier run that failed mid-way must not share the buffer
        comm = get_ring(self.ring_id)
        overlap = self.overlap if self.overlap is not None else comm.transport != "shm"
        flat = self._bind(ctx, comm, overlap)
        run, args = (comm.reduce_scatter_v, (flat, self.bounds(comm.nranks))) \
            if self.scatters else (comm.all_reduce, (flat,))
        after = None if self.shard is None else self.shard.keeper(
            ctx, flat, self.names, self.roots, self.shapes, comm.rank)
        if not overlap:
            run(*args)
            if after is not None:
                after()
            return
        stream = ctx.executor.comm_stream(self.ring_id)
        what = f"rank {comm.rank}: {'reduce-scatter' if self.scatters else 'all-reduce'} of " \
               f"gradient bucket {self.number} on ring {self.ring_id}"
        self._inflight[ctx.scope] = (stream.submit(what, comm.settings.comm_timeout, run, *args),
                                     after)

    def wait(self, ctx) -> None:
        self.wait_scope(ctx.scope)

    def wait_scope(self, scope) -> None:
        job: tuple[Handle, Callable | None] | None = self._inflight.pop(scope, None)
        if job is not None:
            job[0].wait()
            if job[1] is not None:
                job[1]()

    def _bind(self, ctx, comm, overlap: bool) -> np.ndarray:
        """The scope's flat buffer, every gradient a view into it: a kernel that wrote its
        gradient elsewhere (the first run, or one that hands out another array) is copied
        in once, and the view becomes the array the executor reuses for that gradient."""
        buffers = self._buffers.get(ctx.scope)
        if buffers is None:
            # in the ring's shared memory when its ranks share a host, so a large bucket is
            # all-reduced where it lies (every rank binds its buckets in the same order)
            total = sum(int(np.prod(s)) for s in self.shapes)
            flat = comm.shared_array(total, self.dtype) if self.pool is None \
                else self.pool.buffer(ctx.scope, comm, self.slot if overlap else 0)[:total]
            views, at = [], 0
            for shape in self.shapes:
                size = int(np.prod(shape))
                views.append(flat[at:at + size].reshape(shape))
                at += size
            buffers = self._buffers[ctx.scope] = (flat, views)
        flat, views = buffers
        values = ctx.scope._vars
        for name, view in zip(self.names, views):
            current = values.get(name)
            if current is not view:
                if current is not None:
                    np.copyto(view, current.reshape(view.shape))
                values[name] = view
                ctx.executor.adopt(name, view)
        return flat


def _wait_all_step(block, ring: int, buckets: list[Bucket], index: int) -> Step:
    """c_sync_comm_stream made real: wait for every bucket of the ring."""
    names = [n for b in buckets for n in b.names]
    op = Operator(block, _SYNC_COMM, {"X": names[:1]}, {"Out": names[:1]},
                  {"ring_id": ring, OP_ROLE_KEY: int(OpRole.Backward)})

    def kernel(ctx) -> None:
        for bucket in buckets:
            bucket.wait(ctx)

    return Step(op, kernel, index)


def comm_stream_name(ring_id: int) -> str:
    return f"ringflow-comm-ring{ring_id}"


__all__ = ["Bucket", "CommStream", "Pending", "comm_stream_name", "extract", "place"]
