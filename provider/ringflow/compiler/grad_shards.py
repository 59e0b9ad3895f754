"""Stage 2 of sharding: gradients sharded too (``c_reduce_sum`` with ``sharding_stage`` 2).

A rank needs all of a bucket's gradients only from their writes until the bucket's
reduce-scatter; afterwards only its own range. So the stage-2 buckets of one ring and dtype
share staging buffers (``StagingPool``, in the ring's shared memory on one host): one when
the buckets are reduced synchronously (shared memory, by default), two taking turns when
they are reduced on the communication thread (TCP). After the reduce-scatter this rank's
range is copied into a buffer of its own (``GradShard``) when a later bucket writes the
staging buffer again; its gradients then are there for the clip and the update. Gradient
memory per rank: one (or two) buckets plus 1/n of the gradients, not all of them (a model
of one bucket keeps its gradients in the staging buffer, as stage 1). A bucket whose
writes could begin before the bucket before it is reduced (a gradient accumulated over the
backward pass) gets buffers of its own instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np


class StagingPool:
    """Two flat buffers of ``nelems`` per scope, made on first use (every rank of the ring
    makes them in the same order: the buckets bind in plan order)."""

    def __init__(self, ring_id: int, dtype: np.dtype, nelems: int) -> None:
        self.ring_id, self.dtype, self.nelems = ring_id, np.dtype(dtype), nelems
        self._buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def buffer(self, scope, comm, slot: int) -> np.ndarray:
        pair = self._buffers.setdefault(scope, [None, None])
        if pair[slot] is None:
            pair[slot] = comm.shared_array(self.nelems, self.dtype)
        return pair[slot]


class GradShard:
    """This rank's reduced gradients of one bucket, kept between its reduce-scatter and
    the update."""

    def __init__(self) -> None:
        self._buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def keeper(self, ctx, flat: np.ndarray, names: list[str], roots: list[int],
               shapes: list[tuple[int, ...]], rank: int) -> Callable[[], None]:
        """What to run once the reduce-scatter of ``flat`` is done: copy this rank's range
        out and make its gradients views of the copy."""
        scope, executor = ctx.scope, ctx.executor
        sizes = [int(np.prod(s)) for s in shapes]
        starts = np.cumsum([0, *sizes])
        mine = [i for i, r in enumerate(roots) if r == rank]

        def keep() -> None:
            if not mine:
                return
            lo, hi = int(starts[mine[0]]), int(starts[mine[-1] + 1])
            buffers = self._buffers.get(scope)
            if buffers is None or buffers[0].size != hi - lo:
                shard = np.empty(hi - lo, flat.dtype)
                views = [shard[starts[i] - lo:starts[i + 1] - lo].reshape(shapes[i])
                         for i in mine]
                buffers = self._buffers[scope] = (shard, views)
            shard, views = buffers
            np.copyto(shard, flat[lo:hi])
            for i, view in zip(mine, views):
                scope._vars[names[i]] = view
                executor.adopt(names[i], view)

        return keep


def assign_pools(buckets: list, first_write: Callable[[str], int]) -> None:
    """Gives the stage-2 reduce-scatter buckets of each (ring, dtype) their staging buffer.
    Buckets reduced on the calling thread (synchronous) all share one buffer: a bucket is
    reduced and its range kept before the next one's first write. Buckets reduced on the
    communication thread take turns in two (slot k % 2 of the k-th pooled bucket; a wait for
    the bucket two before goes ahead of a bucket's first write). A bucket joins the pool only
    if its first write comes after the launch of the pooled buckets it would overwrite."""
    groups: dict[tuple, list] = {}
    for b in buckets:
        if b.scatters and b.stage == 2:
            groups.setdefault((b.ring_id, b.dtype), []).append(b)
    for (ring, dtype), group in groups.items():
        pool = StagingPool(ring, dtype, max(sum(int(np.prod(s)) for s in b.shapes)
                                            for b in group))
        pooled: list = []
        for bucket in group:
            starts = min(first_write(n) for n in bucket.names)
            before = pooled[-2] if len(pooled) > 1 else None
            if pooled and starts <= pooled[-1].launch_after:
                continue
            bucket.pool, bucket.slot, bucket.reuse_after = pool, len(pooled) % 2, before
            bucket.first_write = starts
            if pooled:   # the next pooled bucket writes where its gradients are
                pooled[-1].shard = GradShard()
            pooled.append(bucket)
