"""Collectives among the ranks of one host through shared-memory slots (see transport/shm.py).

All-reduce works in rounds, one segment of every chunk per round (ring.py defines the words):
each rank copies its segments into its slot and posts; position p reduces segment k of chunk p
from every slot into its own buffer (own values first, then peers in position order, so the
order is fixed) and posts the result in its slot; everyone copies the other chunks' results.
That is the ring's reduce-scatter + all-gather with every hop a direct read: memory traffic
is one pass, not n-1. Small buffers take one round with one post: every rank reduces the
whole buffer from all slots in position order (identical bytes on every rank).

Two slots alternate, and a slot is written again only after every peer has posted once more
after the round that read it, so no trailing barrier is needed.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from ringflow.distributed.collective.ring import (
    RingPlan,
    pieces,
    ranged_plan,
    ring_plan,
    split_piece,
)
from ringflow.distributed.collective.transport.base import Deadline, OpContext, spin_wait
from ringflow.distributed.collective.transport.shm import SEQ, SIG0, Segment, copy_out

Ufunc = Callable[..., np.ndarray]


class IntraHost:
    """The collectives of a communicator whose ranks are all on this host (and the host
    level of the two-level all-reduce). ``chunks`` arguments are (start, stop) by
    position."""

    name = "shm"

    def __init__(self, segments: list[Segment], pos: int, ranks: list[int], ctx: OpContext,
                 check: Callable[[], None], small_bytes: int) -> None:
        self.segs = segments  # by position
        self.pos, self.n = pos, len(segments)
        self.ranks = ranks  # global rank (for messages) by position
        self.ctx = ctx
        self.check = check
        self.small_bytes = small_bytes
        self.slot_bytes = segments[0].slot_bytes
        self.seq = 0
        self.round = 0
        self.free_at = [0, 0]
        self.peers = [p for p in range(self.n) if p != pos]
        self._words = [s.words for s in segments]
        self._peer_words = [self._words[p] for p in self.peers]
        self._deadline: Deadline | None = None
        self._sigs: dict[tuple, int] = {}
        self._views: dict[tuple, list[np.ndarray]] = {}
        self._fast: dict[tuple, tuple] = {}   # (dtype, size, ufunc) -> (sig, views by slot)
        self._fast_last: tuple = (None, -1, None, None)

    # -- synchronisation -----------------------------------------------------------------
    def _post(self) -> None:
        self.seq += 1
        self._words[self.pos][SEQ] = self.seq

    def _wait_all(self, target: int) -> None:
        words = self._peer_words
        for w in words:
            if w[SEQ] < target:
                break
        else:
            return
        late = [0]

        def ready() -> bool:
            for i, w in enumerate(words):
                if w[SEQ] < target:
                    late[0] = i
                    return False
            return True

        spin_wait(ready, self._deadline, self.check,
                  lambda: f"{self.ctx.name(self.ranks[self.peers[late[0]]])} to reach step "
                          f"{target}",
                  self.ctx, lambda: self.ranks[self.peers[late[0]]])

    def _begin_round(self, sig: int) -> tuple[int, int]:
        slot = self.round % 2
        self.round += 1
        self._wait_all(self.free_at[slot])
        self._words[self.pos][SIG0 + slot] = sig
        return slot, sig

    def _check_sig(self, slot: int, sig: int) -> None:
        for p in self.peers:
            if self._words[p][SIG0 + slot] != sig:
                raise self.ctx.error(self.ranks[p], f"{self.ctx.name(self.ranks[p])} runs a "
                                     "different collective or buffer size (op/dtype/count differ)")

    def _end_round(self, slot: int) -> None:
        self.free_at[slot] = self.seq + 1

    def _slot_view(self, pos: int, slot: int, dtype: np.dtype, start: int,
                   count: int) -> np.ndarray:
        raw = self.segs[pos].slot(slot)
        return raw[start:start + count * dtype.itemsize].view(dtype)

    # -- collectives ---------------------------------------------------------------------
    def _signature(self, op: str, buf: np.ndarray, extra: object) -> int:
        key = (op, buf.dtype, buf.size, extra)
        sig = self._sigs.get(key)
        if sig is None:
            if len(self._sigs) > 256:
                self._sigs.clear()
            sig = self._sigs[key] = _signature(op, buf, extra)
        return sig

    def all_reduce(self, buf: np.ndarray, ufunc: Ufunc, deadline: Deadline) -> None:
        self._deadline = deadline
        sig = self._signature("all_reduce", buf, ufunc)
        if buf.nbytes <= min(self.small_bytes, self.slot_bytes):
            self._all_reduce_small(buf, ufunc, sig)
            return
        plan = ring_plan(buf.size, self.n, buf.itemsize, self.slot_bytes // self.n)
        for k in range(plan.nsegments):
            self._all_reduce_round(buf, ufunc, plan, k, sig, [self.pos], self.peers)

    def fast_all_reduce(self, buf: np.ndarray, ufunc: Ufunc, make_deadline) -> None:
        """``_all_reduce_small`` in one function, for the latency-bound sizes: the same
        rounds, slots and signature words, without the calls between them (each Python
        call costs about as much as the hand-off itself); a deadline is made only when a
        peer has to be waited for. ``buf`` is 1-D, contiguous and fits a slot."""
        last = self._fast_last   # the same call again is the common case: skip the lookup
        if last[0] is buf.dtype and last[1] == buf.size and last[2] is ufunc:
            sig, views = last[3]
        else:
            key = (buf.dtype, buf.size, ufunc)
            prepared = self._fast.get(key) or self._fast_prepare(buf, ufunc, key)
            self._fast_last = (*key, prepared)
            sig, views = prepared
        slot = self.round & 1
        self.round += 1
        words, peers = self._words[self.pos], self._peer_words
        for w in peers:
            if w[SEQ] < self.free_at[slot]:
                self._deadline = make_deadline()
                self._wait_all(self.free_at[slot])
                break
        words[SIG0 + slot] = sig
        mine = views[slot]
        mine[self.pos][...] = buf
        self.seq = seq = self.seq + 1
        words[SEQ] = seq
        for w in peers:
            if w[SEQ] < seq:
                self._deadline = make_deadline()
                self._wait_all(seq)
                break
        for w in peers:
            if w[SIG0 + slot] != sig:
                self._check_sig(slot, sig)
        ufunc(mine[0], mine[1], out=buf)
        for v in mine[2:]:
            ufunc(buf, v, out=buf)
        self.free_at[slot] = seq + 1

    def _fast_prepare(self, buf: np.ndarray, ufunc: Ufunc, key: tuple) -> tuple:
        if len(self._fast) > 64:
            self._fast.clear()
        views = [[self._slot_view(p, slot, buf.dtype, 0, buf.size) for p in range(self.n)]
                 for slot in (0, 1)]
        self._fast[key] = (self._signature("all_reduce", buf, ufunc), views)
        return self._fast[key]

    def _all_reduce_small(self, buf: np.ndarray, ufunc: Ufunc, sig: int) -> None:
        slot, sig = self._begin_round(sig)
        key = (slot, buf.dtype, buf.size)
        views = self._views.get(key)
        if views is None:
            views = [self._slot_view(p, slot, buf.dtype, 0, buf.size) for p in range(self.n)]
            if len(self._views) > 64:
                self._views.clear()
            self._views[key] = views
        views[self.pos][...] = buf
        self._post()
        self._wait_all(self.seq)
        self._check_sig(slot, sig)
        ufunc(views[0], views[1], out=buf)
        for v in views[2:]:
            ufunc(buf, v, out=buf)
        self._end_round(slot)

    def _all_reduce_round(self, buf: np.ndarray, ufunc: Ufunc, plan: RingPlan, k: int,
                          sig: int, mine: list[int], others: list[int],
                          gather: bool = True) -> None:
        """Round k: segment k of every chunk of `plan`; chunk c belongs to position
        c % n (`mine`: this position's chunks, `others`: the rest), at offset c in the
        slots."""
        slot, sig = self._begin_round(sig)
        dt, cap = buf.dtype, plan.segment_elems * buf.itemsize
        for c in others:  # stage the segments the other positions reduce
            a, b = plan.segment(c, k)
            self._slot_view(self.pos, slot, dt, c * cap, b - a)[...] = buf[a:b]
        self._post()
        self._wait_all(self.seq)
        self._check_sig(slot, sig)
        for c in mine:
            a, b = plan.segment(c, k)
            seg = buf[a:b]
            for p in self.peers:
                ufunc(seg, self._slot_view(p, slot, dt, c * cap, b - a), out=seg)
        if gather:
            for c in mine:
                a, b = plan.segment(c, k)
                self._slot_view(self.pos, slot, dt, c * cap, b - a)[...] = buf[a:b]
            self._post()
            self._wait_all(self.seq)
            for c in others:
                a, b = plan.segment(c, k)
                copy_out(buf[a:b], self._slot_view(c % self.n, slot, dt, c * cap, b - a))
        self._end_round(slot)

    def _owned(self, nchunks: int) -> tuple[list[int], list[int]]:
        """This position's chunks and the others' when chunk c belongs to position c % n."""
        if nchunks % self.n:
            raise ValueError(f"{nchunks} chunks do not fall evenly on {self.n} positions")
        mine = list(range(self.pos, nchunks, self.n))
        return mine, [c for c in range(nchunks) if c % self.n != self.pos]

    def all_reduce_in_place(self, arrays: list[np.ndarray], ufunc: Ufunc,
                            deadline: Deadline) -> None:
        """All-reduce of buffers that live in shared memory themselves (`arrays[p]` is
        position p's, mapped here): position p reduces chunk p in its own buffer reading the
        peers' directly, then every rank copies the other chunks from their owners. No
        staging through the slots, so half the bytes cross between cores; three hand-offs
        (all written, all reduced, all copied: only then may an owner write its buffer)."""
        self._deadline = deadline
        buf = arrays[self.pos]
        slot, sig = self._begin_round(self._signature("all_reduce_in_place", buf, ufunc))
        self._post()
        self._wait_all(self.seq)
        self._check_sig(slot, sig)
        a, b = split_piece(buf.size, self.n, self.pos)
        mine = buf[a:b]
        for p in self.peers:  # own values first, then the peers in position order
            ufunc(mine, arrays[p][a:b], out=mine)
        self._post()
        self._wait_all(self.seq)
        for p in self.peers:
            a, b = split_piece(buf.size, self.n, p)
            copy_out(buf[a:b], arrays[p][a:b])
        self._post()
        self._wait_all(self.seq)
        self._end_round(slot)

    def reduce_scatter(self, buf: np.ndarray, ufunc: Ufunc, deadline: Deadline) -> None:
        """Afterwards chunk `pos` of `buf` (n equal chunks) holds the reduction."""
        self.reduce_scatter_v(buf, ring_plan(buf.size, self.n, 1, 1).chunks, ufunc, deadline)

    def reduce_scatter_v(self, buf: np.ndarray, chunks, ufunc: Ufunc,
                         deadline: Deadline) -> None:
        """Afterwards ``buf[chunks[pos]]`` holds the reduction over every position (the
        other chunks hold partial sums); ``chunks`` are (start, stop) by position, any
        sizes. More chunks than positions (a multiple): chunk c is position c % n's (the
        host level of two-level sharding: every host's parts in one pass)."""
        self._deadline = deadline
        sig = self._signature("reduce_scatter_v", buf, tuple(chunks))
        mine, others = self._owned(len(chunks))
        plan = ranged_plan(buf.size, chunks, buf.itemsize, self.slot_bytes // len(chunks))
        for k in range(plan.nsegments):
            self._all_reduce_round(buf, ufunc, plan, k, sig, mine, others, gather=False)

    def all_gather_chunks(self, buf: np.ndarray, deadline: Deadline) -> None:
        """The second half of ``all_reduce`` after ``reduce_scatter``: chunk `pos` of `buf`
        is this position's, the others are copied in from their positions."""
        self.all_gather_v(buf, ring_plan(buf.size, self.n, 1, 1).chunks, deadline)

    def all_gather_v(self, buf: np.ndarray, chunks, deadline: Deadline) -> None:
        """``buf[chunks[c]]`` is position (c % n)'s for every chunk c afterwards (this
        position's chunks are read, the others written)."""
        self._deadline = deadline
        sig = self._signature("all_gather_v", buf, tuple(chunks))
        mine, others = self._owned(len(chunks))
        plan = ranged_plan(buf.size, chunks, buf.itemsize, self.slot_bytes // len(chunks))
        dt, cap = buf.dtype, plan.segment_elems * buf.itemsize
        for k in range(plan.nsegments):
            slot, sig = self._begin_round(sig)
            for c in mine:
                a, b = plan.segment(c, k)
                self._slot_view(self.pos, slot, dt, c * cap, b - a)[...] = buf[a:b]
            self._post()
            self._wait_all(self.seq)
            self._check_sig(slot, sig)
            for c in others:
                a, b = plan.segment(c, k)
                copy_out(buf[a:b], self._slot_view(c % self.n, slot, dt, c * cap, b - a))
            self._end_round(slot)

    def reduce_scatter_in_place(self, arrays: list[np.ndarray], chunks, ufunc: Ufunc,
                                deadline: Deadline) -> None:
        """``reduce_scatter_v`` of buffers in shared memory (``arrays[p]`` is position p's):
        position p reduces chunk p where it lies, reading the peers' chunks directly. Two
        hand-offs: all written, then all read (only then may a peer write its buffer)."""
        self._deadline = deadline
        buf = arrays[self.pos]
        slot, sig = self._begin_round(self._signature("rs_in_place", buf, (ufunc, *chunks)))
        self._post()
        self._wait_all(self.seq)
        self._check_sig(slot, sig)
        a, b = chunks[self.pos]
        mine = buf[a:b]
        for p in self.peers:  # own values first, then the peers in position order
            ufunc(mine, arrays[p][a:b], out=mine)
        self._post()
        self._wait_all(self.seq)
        self._end_round(slot)

    def all_gather_in_place(self, arrays: list[np.ndarray], chunks,
                            deadline: Deadline) -> None:
        """``all_gather_v`` of buffers in shared memory: each position copies the others'
        chunks straight from their buffers. Two hand-offs: all chunks final, all copied."""
        self._deadline = deadline
        buf = arrays[self.pos]
        slot, sig = self._begin_round(self._signature("ag_in_place", buf, tuple(chunks)))
        self._post()
        self._wait_all(self.seq)
        self._check_sig(slot, sig)
        for p in self.peers:
            a, b = chunks[p]
            copy_out(buf[a:b], arrays[p][a:b])
        self._post()
        self._wait_all(self.seq)
        self._end_round(slot)

    def all_gather(self, buf: np.ndarray, out: np.ndarray, deadline: Deadline) -> None:
        """out[p] = position p's `buf`, for every position (out has shape (n, buf.size))."""
        self._deadline = deadline
        sig = self._signature("all_gather", buf, None)
        per = max(1, self.slot_bytes // buf.itemsize)
        for a, b in pieces(buf.size, per):
            slot, sig = self._begin_round(sig)
            self._slot_view(self.pos, slot, buf.dtype, 0, b - a)[...] = buf[a:b]
            self._post()
            self._wait_all(self.seq)
            self._check_sig(slot, sig)
            out[self.pos, a:b] = buf[a:b]
            for p in self.peers:
                copy_out(out[p, a:b], self._slot_view(p, slot, buf.dtype, 0, b - a))
            self._end_round(slot)

    def close(self, goodbye: bool = True) -> None:
        """The segments are the communicator's, which closes them."""

    def broadcast(self, buf: np.ndarray, root_pos: int, deadline: Deadline) -> None:
        self._deadline = deadline
        sig = self._signature("broadcast", buf, root_pos)
        per = max(1, self.slot_bytes // buf.itemsize)
        for a, b in pieces(buf.size, per):
            slot, sig = self._begin_round(sig)
            if self.pos == root_pos:
                self._slot_view(self.pos, slot, buf.dtype, 0, b - a)[...] = buf[a:b]
            self._post()
            self._wait_all(self.seq)
            self._check_sig(slot, sig)
            if self.pos != root_pos:
                copy_out(buf[a:b], self._slot_view(root_pos, slot, buf.dtype, 0, b - a))
            self._end_round(slot)


def _signature(op: str, buf: np.ndarray, extra: object) -> int:
    """A number every rank computes alike for the same call, to catch diverging ranks."""
    text = f"{op}|{buf.dtype.str}|{buf.size}|{getattr(extra, '__name__', extra)}"
    return zlib.crc32(text.encode())
