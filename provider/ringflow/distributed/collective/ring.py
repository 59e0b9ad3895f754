"""The bandwidth-optimal ring (reduce-scatter then all-gather, 2(n-1) steps) and the pure
chunk/segment plan that both the ring and the intra-host shared-memory algorithm follow.

Words used throughout the collectives:
  chunk   - the 1/n part of a buffer that one ring position owns: in the reduce-scatter,
            position p ends holding the fully reduced chunk (p + 1) % n. Chunk sizes differ
            by at most one element (the first count % n chunks get the extra one).
  segment - the unit one message (or one shared-memory round) moves: each chunk is cut into
            the same number of segments, at most `max_segment_bytes` each, so large buffers
            are pipelined (reduce segment k while segment k+1 is in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ringflow.distributed.collective.transport.base import Deadline
from ringflow.distributed.collective.transport.tcp import TcpLink, byte_view


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of `parts` near-equal pieces of range(count), larger ones first."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class RingPlan:
    count: int
    nranks: int
    chunks: tuple[tuple[int, int], ...]
    nsegments: int
    segment_elems: int  # capacity of one segment, in elements

    def segment(self, chunk: int, k: int) -> tuple[int, int]:
        """[start, stop) in the whole buffer of segment k of `chunk` (may be empty)."""
        start, stop = self.chunks[chunk]
        a, b = split(stop - start, self.nsegments)[k]
        return start + a, start + b


def ring_plan(count: int, nranks: int, itemsize: int, max_segment_bytes: int) -> RingPlan:
    if count < 0 or nranks < 1 or itemsize < 1:
        raise ValueError(f"bad plan request: count={count} nranks={nranks} itemsize={itemsize}")
    chunks = tuple(split(count, nranks))
    largest = chunks[0][1] - chunks[0][0]
    per_segment = max(1, max_segment_bytes // itemsize)
    nsegments = max(1, -(-largest // per_segment))
    return RingPlan(count, nranks, chunks, nsegments, -(-largest // nsegments) if largest else 0)


def reduce_scatter_steps(pos: int, n: int) -> list[tuple[int, int]]:
    """(chunk sent right, chunk received from the left and reduced) for each of n-1 steps."""
    return [((pos - s) % n, (pos - s - 1) % n) for s in range(n - 1)]


def all_gather_steps(pos: int, n: int, owned_shift: int = 1) -> list[tuple[int, int]]:
    """(chunk sent, chunk received) for n-1 steps, starting from owning chunk pos+shift."""
    return [((pos + owned_shift - s) % n, (pos + owned_shift - s - 1) % n) for s in range(n - 1)]


Ufunc = Callable[..., np.ndarray]


def ring_all_reduce(buf: np.ndarray, ufunc: Ufunc, link: TcpLink, pos: int, n: int,
                    plan: RingPlan, deadline: Deadline) -> None:
    """In-place all-reduce of the 1-D contiguous `buf` around the ring."""
    scratch = np.empty(plan.segment_elems, dtype=buf.dtype)
    for send_c, recv_c in reduce_scatter_steps(pos, n):
        s0, s1 = plan.chunks[send_c]
        link.begin_send(byte_view(buf[s0:s1]))
        for k in range(plan.nsegments):
            r0, r1 = plan.segment(recv_c, k)
            tmp = scratch[:r1 - r0]
            link.recv_into(byte_view(tmp), deadline)
            # the left partial sum comes first: fixed order, so replicas agree bit for bit
            ufunc(tmp, buf[r0:r1], out=buf[r0:r1])
        link.finish_send(deadline)
    ring_all_gather_chunks(buf, link, pos, n, plan.chunks, 1, deadline)


def ring_all_gather_chunks(buf: np.ndarray, link: TcpLink, pos: int, n: int,
                           chunks: tuple[tuple[int, int], ...] | list[tuple[int, int]],
                           owned_shift: int, deadline: Deadline) -> None:
    """Circulate chunks until every position holds all; position p starts with chunk
    (p + owned_shift) % n."""
    for send_c, recv_c in all_gather_steps(pos, n, owned_shift):
        s0, s1 = chunks[send_c]
        r0, r1 = chunks[recv_c]
        link.begin_send(byte_view(buf[s0:s1]))
        link.recv_into(byte_view(buf[r0:r1]), deadline)
        link.finish_send(deadline)


def ring_broadcast(buf: np.ndarray, link: TcpLink, pos: int, root_pos: int, n: int,
                   max_segment_bytes: int, deadline: Deadline) -> None:
    """Pipelined chain root -> root+1 -> ... -> root-1, one segment at a time."""
    dist = (pos - root_pos) % n
    last = dist == n - 1
    step = max(1, max_segment_bytes // max(buf.itemsize, 1))
    for a in range(0, buf.size, step):
        seg = byte_view(buf[a:a + step])
        if dist:
            link.recv_into(seg, deadline)  # pushes the previous segment on meanwhile
        if not last:
            link.finish_send(deadline)
            link.begin_send(seg)
    link.finish_send(deadline)
