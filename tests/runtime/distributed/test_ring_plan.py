"""The chunk/segment plan and the ring schedule are pure functions: checked here alone."""

from __future__ import annotations

import itertools

import pytest

from ringflow.distributed.collective.ring import (
    all_gather_steps,
    reduce_scatter_steps,
    ring_plan,
    split,
    split_piece,
)


@pytest.mark.parametrize("count,parts", [(0, 1), (0, 4), (1, 4), (7, 3), (1003, 4), (12, 4)])
def test_split_covers_the_range_with_sizes_differing_by_at_most_one(count, parts):
    bounds = split(count, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("count,parts", [(0, 1), (0, 4), (1, 4), (7, 3), (1003, 4), (12, 4),
                                         (1 << 26, 256)])
def test_split_piece_is_one_piece_of_split(count, parts):
    assert [split_piece(count, parts, i) for i in range(parts)] == split(count, parts)


@pytest.mark.parametrize("count,n,itemsize,seg", [(0, 2, 4, 64), (1, 3, 8, 64), (1003, 4, 4, 64),
                                                  (6001, 3, 8, 4096), (10, 1, 2, 1 << 20)])
def test_segments_tile_every_chunk_and_respect_the_segment_size(count, n, itemsize, seg):
    plan = ring_plan(count, n, itemsize, seg)
    covered = []
    for c in range(n):
        segs = [plan.segment(c, k) for k in range(plan.nsegments)]
        assert segs[0][0] == plan.chunks[c][0] and segs[-1][1] == plan.chunks[c][1]
        assert all((b - a) * itemsize <= max(seg, itemsize) for a, b in segs)
        assert all(b - a <= plan.segment_elems for a, b in segs)
        covered += [i for a, b in segs for i in range(a, b)]
    assert covered == list(range(count))


def test_large_buffers_are_cut_into_several_segments():
    plan = ring_plan(1 << 20, 4, 4, 64 << 10)  # 1 MiB per chunk, 64 KiB segments
    assert plan.nsegments == 16 and plan.segment_elems == 16384


def test_bad_plan_requests_are_rejected():
    with pytest.raises(ValueError):
        ring_plan(-1, 2, 4, 64)


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_reduce_scatter_schedule_reduces_every_chunk_exactly_once_per_other_rank(n):
    # simulate: contributions[pos][chunk] = set of ranks summed into pos's copy of chunk
    have = [[{p} for _ in range(n)] for p in range(n)]
    for s in range(n - 1):
        sent = {p: reduce_scatter_steps(p, n)[s] for p in range(n)}
        new = [list(row) for row in have]
        for p in range(n):
            send_c, _ = sent[p]
            right = (p + 1) % n
            assert reduce_scatter_steps(right, n)[s][1] == send_c  # right receives what p sends
            new[right][send_c] = have[right][send_c] | have[p][send_c]
        have = new
    for p in range(n):
        assert have[p][(p + 1) % n] == set(range(n))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_all_gather_schedule_delivers_every_chunk_to_every_rank(n):
    holds = [{(p + 1) % n} for p in range(n)]
    for s in range(n - 1):
        steps = {p: all_gather_steps(p, n)[s] for p in range(n)}
        for p in range(n):
            assert steps[p][0] in holds[p]  # only sends what it already has
        for p in range(n):
            holds[(p + 1) % n].add(steps[p][0])
            assert steps[(p + 1) % n][1] == steps[p][0]
    assert all(h == set(range(n)) for h in holds)
