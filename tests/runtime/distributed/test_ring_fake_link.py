"""The ring algorithms (ring.py) on their own, as gloo tests its algorithms: every position a
thread with an in-memory ``Link`` to its neighbours, no process, socket or segment. World
sizes 1 to 4, counts 0, 1, odd, not divisible by the world, larger than a segment; float32,
float64, int64; every rank ends with the numpy result (bitwise equal across ranks); a link
that never delivers makes the waiting rank fail at its deadline, naming the peer."""

from __future__ import annotations

import itertools
import queue
import threading

import numpy as np
import pytest

from ringflow.distributed.collective import ring
from ringflow.distributed.collective.transport.base import Deadline, OpContext
from ringflow.errors import CommTimeoutError


class FakeLink:
    """A ``Link`` over in-memory queues: ``send`` hands a copy of the bytes to the right
    neighbour's inbox, ``recv_into`` takes the next message from this position's inbox
    within the deadline (the left neighbour is the only sender to it)."""

    def __init__(self, pos: int, inboxes: list[queue.Queue], ctx: OpContext,
                 left: int) -> None:
        self.pos, self.inboxes, self.ctx, self.left = pos, inboxes, ctx, left
        self.sent = 0

    def send(self, data: memoryview, deadline: Deadline) -> None:
        self.inboxes[(self.pos + 1) % len(self.inboxes)].put(bytes(data))
        self.sent += len(data)

    def recv_into(self, view: memoryview, deadline: Deadline) -> None:
        try:
            data = self.inboxes[self.pos].get(timeout=max(deadline.remaining(), 0.0))
        except queue.Empty:
            raise self.ctx.error(self.left, f"no data from rank {self.left} within "
                                 f"{deadline.seconds:g} s", timeout=True) from None
        if len(data) != len(view):
            raise AssertionError(f"position {self.pos}: got {len(data)} bytes, expected "
                                 f"{len(view)}")
        if len(view):                # an empty view is a read-only b"": nothing to fill
            view[:] = data

    def check(self) -> None:
        return None

    def close(self, goodbye: bool = True) -> None:
        return None


def run_ring(n: int, work, timeout: float = 10.0) -> list:
    """Runs ``work(pos, link)`` on n threads, one per position; returns their results."""
    inboxes = [queue.Queue() for _ in range(n)]
    links = [FakeLink(p, inboxes, OpContext(p, 0, "test"), (p - 1) % n) for p in range(n)]
    results: list = [None] * n
    errors: list = []

    def target(p: int) -> None:
        try:
            results[p] = work(p, links[p])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(p,)) for p in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a position did not finish"
    if errors:
        raise errors[0]
    return results


def inputs(n: int, count: int, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(count * 10 + n)
    if np.dtype(dtype).kind == "i":
        return [rng.integers(-1000, 1000, count).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


COUNTS = [0, 1, 7, 1003, 6001]
SEGMENT_BYTES = 1024            # 6001 float64 elements make several segments per chunk


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_ring_all_reduce_gives_every_rank_the_sum(n, count, dtype):
    data = inputs(n, count, dtype)

    def work(pos, link):
        buf = data[pos].copy()
        plan = ring.ring_plan(count, n, buf.itemsize, SEGMENT_BYTES)
        if n > 1:
            ring.ring_all_reduce(buf, np.add, link, pos, n, plan, Deadline(5))
        return buf

    out = run_ring(n, work)
    tol = {"float32": 1e-5}.get(dtype, 1e-12)       # sums in another order than numpy's
    np.testing.assert_allclose(out[0], np.sum(data, axis=0), rtol=tol, atol=tol)
    for other in out[1:]:
        np.testing.assert_array_equal(other, out[0])


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("count", [1, 7, 100])
def test_the_small_all_reduce_reduces_in_position_order_on_every_rank(n, count):
    data = inputs(n, count, "float64")

    def work(pos, link):
        buf = data[pos].copy()
        ring.ring_all_reduce_small(buf, np.add, link, pos, n, Deadline(5))
        return buf

    out = run_ring(n, work)
    expected = data[0] + data[1]
    for extra in data[2:]:
        expected = expected + extra
    for got in out:
        np.testing.assert_array_equal(got, expected)   # the same order: the same bytes


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("count", [0, 5, 1003])
def test_reduce_scatter_leaves_each_position_its_reduced_chunk(n, count):
    data = inputs(n, count, "float64")
    total = np.sum(data, axis=0)

    def work(pos, link):
        buf = data[pos].copy()
        plan = ring.ring_plan(count, n, buf.itemsize, SEGMENT_BYTES)
        ring.ring_reduce_scatter(buf, np.add, link, pos, n, plan, Deadline(5))
        a, b = plan.chunks[(pos + 1) % n]
        return buf[a:b], total[a:b]

    for got, want in run_ring(n, work):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("count", [1, 9, 700])
def test_all_gather_and_broadcast_deliver_every_rows_bytes(n, count):
    data = inputs(n, count, "float32")

    def gather(pos, link):
        rows = np.zeros((n, count), np.float32)
        rows[pos] = data[pos]
        ring.ring_all_gather(rows, link, pos, n, SEGMENT_BYTES, Deadline(5))
        return rows

    for rows in run_ring(n, gather):
        np.testing.assert_array_equal(rows, np.stack(data))

    for root in range(n):
        def bcast(pos, link, root=root):
            buf = data[pos].copy()
            ring.ring_broadcast(buf, link, pos, root, n, SEGMENT_BYTES, Deadline(5))
            return buf

        for buf in run_ring(n, bcast):
            np.testing.assert_array_equal(buf, data[root])


def test_the_plan_cuts_chunks_into_equal_segments_within_the_limit():
    plan = ring.ring_plan(6001, 4, 8, SEGMENT_BYTES)
    assert plan.chunks[0] == (0, 1501) and plan.chunks[-1] == (4501, 6001)
    assert plan.nsegments == 12 and plan.segment_elems * 8 <= SEGMENT_BYTES
    covered = sorted(plan.segment(c, k) for c in range(4) for k in range(plan.nsegments))
    assert covered[0][0] == 0 and covered[-1][1] == 6001
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # no gap, no overlap


def test_a_neighbour_that_never_sends_fails_the_waiting_rank_at_its_deadline():
    inboxes = [queue.Queue() for _ in range(2)]
    link = FakeLink(0, inboxes, OpContext(0, 7, "all_reduce"), left=1)
    buf = np.ones(10, np.float32)
    plan = ring.ring_plan(10, 2, 4, SEGMENT_BYTES)
    with pytest.raises(CommTimeoutError, match=r"rank 0: all_reduce on ring 7 failed with "
                                               r"peer rank 1: no data from rank 1 within 0.2 s"):
        ring.ring_all_reduce(buf, np.add, link, 0, 2, plan, Deadline(0.2))
    assert link.sent > 0            # it sent its part before it waited


def test_lopsided_parts_take_the_all_reduce_and_keep_every_bit():
    """Parts a ring would wait on (the largest over 2/n of the buffer) go by all-reduce:
    reduce_scatter_v as an all-reduce, all_gather_v as an OR of bits with the others'
    parts zeroed, so negative zeros and NaN payloads arrive as their owner holds them.
    Even enough parts keep the ring's halves (fewer bytes: the link counts them)."""
    n, count = 4, 1000
    assert ring.lopsided([(0, 900), (900, 950), (950, 1000), (1000, 1000)], count)
    assert not ring.lopsided([(0, 250), (250, 500), (500, 750), (750, 1000)], count)
    assert not ring.lopsided([(0, 500), (500, 1000), (1000, 1000), (1000, 1000)], count)
    bounds = [(0, 900), (900, 950), (950, 1000), (1000, 1000)]
    data = inputs(n, count, "float64")
    odd = np.array([-0.0, np.nan, np.inf], dtype=np.float64)
    odd[1:2].view(np.uint64)[0] |= 0xBEEF     # a NaN with a payload
    owner_view = data[0].copy()
    owner_view[:3] = odd

    def work(pos, link):
        algo = ring.RingAlgorithm(link, pos, n, SEGMENT_BYTES, 64)
        summed = data[pos].copy()
        algo.reduce_scatter_v(summed, bounds, np.add, Deadline(5))
        gathered = (owner_view if pos == 0 else data[pos]).copy()
        before = link.sent
        algo.all_gather_v(gathered, bounds, Deadline(5))
        return summed, gathered, link.sent - before

    out = run_ring(n, work)
    total = np.sum(data, axis=0)
    for pos, (summed, gathered, _) in enumerate(out):
        a, b = bounds[pos]
        np.testing.assert_allclose(summed[a:b], total[a:b], rtol=1e-12)
        want = np.concatenate([owner_view[0:900], data[1][900:950], data[2][950:1000]])
        assert gathered.tobytes() == want.tobytes(), pos
    # an all-reduce of 8000 bytes in 4 segments-chunks: each rank sends 2 * 3/4 of it
    assert [sent for _, _, sent in out] == [2 * 3 * 250 * 8] * n
