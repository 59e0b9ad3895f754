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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ringflow.distributed.collective.transport.base import Deadline, Link, byte_view


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of `parts` near-equal pieces of range(count), larger ones first."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def split_piece(count: int, parts: int, i: int) -> tuple[int, int]:
    """``split(count, parts)[i]``."""
    base, extra = divmod(count, parts)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


@dataclass(frozen=True)
class RingPlan:
    count: int
    nranks: int
    chunks: tuple[tuple[int, int], ...]
    nsegments: int
    segment_elems: int  # capacity of one segment, in elements

    def segment(self, chunk: int, k: int) -> tuple[int, int]:
        """[start, stop) in the whole buffer of segment k of `chunk` (may be empty): piece k
        of ``split(chunk length, nsegments)``, computed without building the list (a
        256 MiB buffer has hundreds of segments, asked for several times per round)."""
        start, stop = self.chunks[chunk]
        a, b = split_piece(stop - start, self.nsegments, k)
        return start + a, start + b


def ring_plan(count: int, nranks: int, itemsize: int, max_segment_bytes: int) -> RingPlan:
    if count < 0 or nranks < 1 or itemsize < 1:
        raise ValueError(f"bad plan request: count={count} nranks={nranks} itemsize={itemsize}")
    return ranged_plan(count, split(count, nranks), itemsize, max_segment_bytes)


def ranged_plan(count: int, chunks: Sequence[tuple[int, int]], itemsize: int,
                max_segment_bytes: int) -> RingPlan:
    """The plan of chunks given by their bounds (any sizes, empty ones too, not necessarily
    in buffer order): the reduce-scatter and all-gather of uneven shards (``*_v``)."""
    largest = max((b - a for a, b in chunks), default=0)
    per_segment = max(1, max_segment_bytes // itemsize)
    nsegments = max(1, -(-largest // per_segment))
    return RingPlan(count, len(chunks), tuple(chunks), nsegments,
                    -(-largest // nsegments) if largest else 0)


def reduce_scatter_steps(pos: int, n: int) -> list[tuple[int, int]]:
    """(chunk sent right, chunk received from the left and reduced) for each of n-1 steps."""
    return [((pos - s) % n, (pos - s - 1) % n) for s in range(n - 1)]


def all_gather_steps(pos: int, n: int, owned_shift: int = 1) -> list[tuple[int, int]]:
    """(chunk sent, chunk received) for n-1 steps, starting from owning chunk pos+shift."""
    return [((pos + owned_shift - s) % n, (pos + owned_shift - s - 1) % n) for s in range(n - 1)]


Ufunc = Callable[..., np.ndarray]


def lopsided(chunks: Sequence[tuple[int, int]], count: int) -> bool:
    """Whether the ring's halves over these parts take longer than an all-reduce of the
    whole buffer: each of a half's n-1 steps waits for the largest part, while an
    all-reduce moves 2(n-1)/n of the buffer in even chunks; so a half costs more than a
    whole all-reduce once the largest part exceeds 2/n of the buffer (sharding keeps
    parameters whole: with many ranks a few of them hold everything)."""
    largest = max((b - a for a, b in chunks), default=0)
    return largest * len(chunks) > 2 * count


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def gather_by_all_reduce(all_reduce, buf: np.ndarray, own: tuple[int, int],
                         deadline: Deadline) -> None:
    """An all-gather as an all-reduce: every part but this position's is zeroed and the
    bits are OR-ed together, so each part arrives exactly as its owner holds it (negative
    zeros and NaN payloads too, which adding zeros would not keep)."""
    a, b = own
    buf[:a] = 0
    buf[b:] = 0
    all_reduce(buf.view(_BITS[buf.itemsize]), np.bitwise_or, deadline)


def ring_all_reduce(buf: np.ndarray, ufunc: Ufunc, link: Link, pos: int, n: int,
                    plan: RingPlan, deadline: Deadline) -> None:
    """In-place all-reduce of the 1-D contiguous `buf` around the ring: per step, send one
    segment and receive one, so the next segment arrives while this one is reduced."""
    ring_reduce_scatter(buf, ufunc, link, pos, n, plan, deadline)
    ring_all_gather_chunks(buf, link, pos, n, plan, deadline)


def ring_all_gather_chunks(buf: np.ndarray, link: Link, pos: int, n: int, plan: RingPlan,
                           deadline: Deadline) -> None:
    """The all-gather half of ``ring_all_reduce``: position p starts holding chunk
    (p + 1) % n of `buf` and every position ends holding every chunk."""
    for send_c, recv_c in all_gather_steps(pos, n):
        for k in range(plan.nsegments):
            s0, s1 = plan.segment(send_c, k)
            r0, r1 = plan.segment(recv_c, k)
            link.send(byte_view(buf[s0:s1]), deadline)
            link.recv_into(byte_view(buf[r0:r1]), deadline)


def ring_all_reduce_small(buf: np.ndarray, ufunc: Ufunc, link: Link, pos: int, n: int,
                          deadline: Deadline) -> None:
    """Latency-bound sizes: circulate whole buffers (n-1 hops instead of 2(n-1)), then every
    rank reduces all of them in position order, so all ranks compute identical bytes."""
    rows = np.empty((n, buf.size), dtype=buf.dtype)
    rows[pos] = buf
    for send_p, recv_p in all_gather_steps(pos, n, owned_shift=0):
        link.send(byte_view(rows[send_p]), deadline)
        link.recv_into(byte_view(rows[recv_p]), deadline)
    ufunc(rows[0], rows[1], out=buf)
    for p in range(2, n):
        ufunc(buf, rows[p], out=buf)


def ring_reduce_scatter(buf: np.ndarray, ufunc: Ufunc, link: Link, pos: int, n: int,
                        plan: RingPlan, deadline: Deadline) -> None:
    """Afterwards chunk (pos + 1) % n of `buf` holds the reduction over all positions."""
    scratch = np.empty(plan.segment_elems, dtype=buf.dtype)
    for send_c, recv_c in reduce_scatter_steps(pos, n):
        for k in range(plan.nsegments):
            s0, s1 = plan.segment(send_c, k)
            r0, r1 = plan.segment(recv_c, k)
            tmp = scratch[:r1 - r0]
            link.send(byte_view(buf[s0:s1]), deadline)
            link.recv_into(byte_view(tmp), deadline)
            # the left partial sum comes first: fixed order, so replicas agree bit for bit
            ufunc(tmp, buf[r0:r1], out=buf[r0:r1])


def ring_all_gather(rows: np.ndarray, link: Link, pos: int, n: int,
                    max_segment_bytes: int, deadline: Deadline) -> None:
    """rows[p] holds position p's contribution; circulate until every position has all."""
    plan = ring_plan(rows.size, n, rows.itemsize, max_segment_bytes)
    flat = rows.reshape(-1)
    per = rows.shape[1]
    for send_c, recv_c in all_gather_steps(pos, n, owned_shift=0):
        for a, b in pieces(per, plan.segment_elems or 1):
            link.send(byte_view(flat[send_c * per + a:send_c * per + b]), deadline)
            link.recv_into(byte_view(flat[recv_c * per + a:recv_c * per + b]), deadline)


def ring_broadcast(buf: np.ndarray, link: Link, pos: int, root_pos: int, n: int,
                   max_segment_bytes: int, deadline: Deadline) -> None:
    """Pipelined chain root -> root+1 -> ... -> root-1, one segment at a time."""
    dist = (pos - root_pos) % n
    step = max(1, max_segment_bytes // max(buf.itemsize, 1))
    for a, b in pieces(buf.size, step):
        seg = byte_view(buf[a:b])
        if dist:
            link.recv_into(seg, deadline)
        if dist != n - 1:
            link.send(seg, deadline)


def pieces(count: int, per: int) -> list[tuple[int, int]]:
    return split(count, max(1, -(-count // per))) if count else []


class RingAlgorithm:
    """The collectives over a ring of links in host-major order (TCP, with shared-memory
    hops between neighbours of one host): the flat ring of a communicator whose ranks are
    not all on one host. ``chunks`` arguments are (start, stop) by ring position."""

    name = "ring"

    def __init__(self, link: Link, pos: int, n: int, segment_bytes: int,
                 small_bytes: int) -> None:
        self.link, self.pos, self.n = link, pos, n
        self.segment_bytes, self.small_bytes = segment_bytes, small_bytes

    def all_reduce(self, flat: np.ndarray, ufunc: Ufunc, deadline: Deadline) -> None:
        if flat.nbytes <= self.small_bytes:
            ring_all_reduce_small(flat, ufunc, self.link, self.pos, self.n, deadline)
            return
        plan = ring_plan(flat.size, self.n, flat.itemsize, self.segment_bytes)
        ring_all_reduce(flat, ufunc, self.link, self.pos, self.n, plan, deadline)

    def _shifted(self, flat: np.ndarray, chunks) -> RingPlan:
        # the ring leaves chunk (p + 1) % n at position p: chunk c is position c-1's range
        by_chunk = [chunks[(c - 1) % self.n] for c in range(self.n)]
        return ranged_plan(flat.size, by_chunk, flat.itemsize, self.segment_bytes)

    def reduce_scatter_v(self, flat: np.ndarray, chunks, ufunc: Ufunc,
                         deadline: Deadline) -> None:
        if lopsided(chunks, flat.size):
            self.all_reduce(flat, ufunc, deadline)
            return
        ring_reduce_scatter(flat, ufunc, self.link, self.pos, self.n,
                            self._shifted(flat, chunks), deadline)

    def all_gather_v(self, flat: np.ndarray, chunks, deadline: Deadline) -> None:
        if lopsided(chunks, flat.size):
            gather_by_all_reduce(self.all_reduce, flat, chunks[self.pos], deadline)
            return
        ring_all_gather_chunks(flat, self.link, self.pos, self.n, self._shifted(flat, chunks),
                               deadline)

    def all_gather(self, flat: np.ndarray, out: np.ndarray, deadline: Deadline) -> None:
        ring_all_gather(out, self.link, self.pos, self.n, self.segment_bytes, deadline)

    def broadcast(self, flat: np.ndarray, root_pos: int, deadline: Deadline) -> None:
        ring_broadcast(flat, self.link, self.pos, root_pos, self.n, self.segment_bytes,
                       deadline)

    def close(self, goodbye: bool = True) -> None:
        """The link is the communicator's, which closes it."""
