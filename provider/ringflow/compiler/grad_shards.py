"""Stage 2 of sharding: gradients sharded too (``c_reduce_sum`` with ``sharding_stage`` 2).

A rank needs all of a bucket's gradients only from their writes until the bucket's
reduce-scatter; afterwards only its own range. So the stage-2 buckets of one ring and dtype
take turns in two staging buffers (``StagingPool``: bucket j writes into buffer j % 2, in
the ring's shared memory on one host), and after the reduce-scatter this rank's range is
copied into a buffer of its own (``GradShard``) when a later bucket writes the staging
buffer again; its gradients then are there for the clip and the update. Gradient memory
per rank: two buckets plus 1/n of the gradients, not all of them (a model of one or two
buckets keeps its gradients in the staging buffers, as stage 1). A bucket whose writes
could begin before the bucket two before it is reduced (a gradient accumulated over the
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
    """Gives the stage-2 reduce-scatter buckets of each (ring, dtype) their staging slot:
    bucket j of them shares buffer j % 2 with bucket j - 2, if all of bucket j's writes
    come after bucket j - 2 is launched (then a wait for j - 2 before them suffices)."""
    groups: dict[tuple, list] = {}
    for b in buckets:
        if b.scatters and b.stage == 2:
            groups.setdefault((b.ring_id, b.dtype), []).append(b)
    for (ring, dtype), group in groups.items():
        pool = StagingPool(ring, dtype, max(sum(int(np.prod(s)) for s in b.shapes)
                                            for b in group))
        last: list = [None, None]   # the bucket that used each buffer last
        for j, bucket in enumerate(group):
            starts = min(first_write(n) for n in bucket.names)
            prev = last[j % 2]
            if prev is None or starts > prev.launch_after:
                bucket.pool, bucket.slot, bucket.reuse_after = pool, j % 2, prev
                bucket.first_write = starts
                if prev is not None:   # its gradients must leave the buffer it reuses
                    prev.shard = GradShard()
                last[j % 2] = bucket
