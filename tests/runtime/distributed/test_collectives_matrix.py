"""Every collective over world sizes 1-4 and both transports, checked against numpy.

Each (world size, transport) starts its workers once; they run the whole matrix (every dtype x
op x count 0, 1, odd, non-divisible, larger than a segment) and write their results, which
these tests compare with the numpy reduction and across ranks (bitwise).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.distributed.cases import (
    RS_CASES,
    TOLERANCE,
    V_CASES,
    all_reduce_cases,
    reference,
    rs_input,
    v_bounds,
    v_input,
)

# small segments and slots so 6001 elements take many pipelined rounds, and counts above
# 1 KiB take the distributed (reduce-scatter) shared-memory path
SMALL_SEGMENTS = {"RINGFLOW_SEGMENT_BYTES": "4096", "RINGFLOW_SHM_SLOT_BYTES": "4096",
                  "RINGFLOW_SHM_SMALL_BYTES": "1024", "RINGFLOW_TCP_SMALL_BYTES": "1024",
                  "RINGFLOW_COMM_TIMEOUT": "30",
                  "RINGFLOW_RENDEZVOUS_TIMEOUT": "30"}
# two-hosts: 127.0.0.2 stands for a second host, ranks alternating between the two, so 4 ranks
# all-reduce in two levels (shared memory on a host, TCP across) and 3 in one ring;
# two-hosts-flat: 4 ranks in one ring of shared-memory and TCP hops (RINGFLOW_TWO_LEVEL=0)
CONFIGS = [(1, "shm"), (2, "shm"), (3, "shm"), (4, "shm"), (2, "tcp"), (3, "tcp"), (4, "tcp"),
           (3, "two-hosts"), (4, "two-hosts"), (4, "two-hosts-flat")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run each configuration's workers once; (world, transport) -> per-rank result dicts."""
    from tests.runtime.distributed.spawn import Spawner

    cache: dict = {}

    def get(world: int, transport: str) -> list[dict]:
        if (world, transport) not in cache:
            tmp = tmp_path_factory.mktemp(f"matrix{world}{transport}")
            spawner = Spawner(tmp)
            env = dict(SMALL_SEGMENTS)
            hosts = None
            if transport == "tcp":
                env["RINGFLOW_TRANSPORT"] = "tcp"
            if transport.startswith("two-hosts"):
                hosts = (["127.0.0.1", "127.0.0.2"] * world)[:world]
            if transport == "two-hosts-flat":
                env["RINGFLOW_TWO_LEVEL"] = "0"
            try:
                job = spawner("matrix.py", world, env=env, hosts=hosts)
                codes = job.wait(timeout=90)
                assert codes == [0] * world, job.output()
                assert job.shm_segments() == []
            finally:
                spawner.close()
            cache[(world, transport)] = [dict(np.load(tmp / f"rank{r}.npz"))
                                         for r in range(world)]
        return cache[(world, transport)]

    return get


pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]
params = pytest.mark.parametrize("world,transport", CONFIGS, ids=[f"{w}-{t}" for w, t in CONFIGS])


def _same_bytes_everywhere(per_rank: list[dict], key: str) -> None:
    first = per_rank[0][key]
    for r, res in enumerate(per_rank[1:], 1):
        assert res[key].dtype == first.dtype and res[key].tobytes() == first.tobytes(), \
            f"{key}: rank {r} differs from rank 0"


@params
def test_all_reduce_equals_numpy_for_every_dtype_op_and_count(results, world, transport):
    per_rank = results(world, transport)
    for case in all_reduce_cases():
        expected, scale = reference(case, world)
        got = per_rank[0][case.key]
        assert got.dtype == np.dtype(case.dtype) and got.shape == (case.count,), case.key
        if case.dtype.startswith("int") or case.op in ("MAX", "MIN"):
            np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=case.key)
        else:
            err = np.abs(got.astype(np.float64) - expected)
            tol = TOLERANCE[case.dtype] * np.maximum(scale, np.abs(expected))
            assert np.all(err <= tol), (case.key, float(np.max(err - tol)))


@params
def test_all_reduce_leaves_bitwise_identical_bytes_on_every_rank(results, world, transport):
    per_rank = results(world, transport)
    for case in all_reduce_cases():
        _same_bytes_everywhere(per_rank, case.key)


@params
def test_broadcast_copies_the_source_rank_everywhere(results, world, transport):
    for _rank, res in enumerate(results(world, transport)):
        for src in range(world):
            np.testing.assert_array_equal(res[f"bcast_src{src}"], np.full(1003, src, np.float32))
        np.testing.assert_array_equal(res["bcast_big"], np.arange(6001) * world)


@params
def test_all_gather_returns_every_rank_in_rank_order(results, world, transport):
    for res in results(world, transport):
        for count in (0, 7, 1003):
            want = np.stack([np.arange(count) + 1000.0 * r for r in range(world)])
            np.testing.assert_array_equal(res[f"gather{count}"].reshape(want.shape), want)


@params
def test_reduce_gives_the_sum_to_dst_only(results, world, transport):
    for rank, res in enumerate(results(world, transport)):
        mine = np.arange(11) + rank
        want = sum(np.arange(11) + r for r in range(world)) if rank == world - 1 else mine
        np.testing.assert_array_equal(res["reduce"], want)


@params
def test_reduce_scatter_gives_each_rank_its_reduced_part(results, world, transport):
    for rank, res in enumerate(results(world, transport)):
        want = sum(10.0 * r + rank for r in range(world))
        np.testing.assert_array_equal(res["reduce_scatter"], np.full(5, want))


@params
def test_reduce_scatter_of_large_half_precision_empty_and_2d_blocks(results, world, transport):
    for rank, res in enumerate(results(world, transport)):
        for key, dtype, shape, op in RS_CASES:
            parts = np.stack([rs_input(key, dtype, shape, r, rank).astype(np.float64)
                              for r in range(world)])
            want = {"SUM": parts.sum(0), "AVG": parts.mean(0), "MAX": parts.max(0)}[op]
            assert res[key].dtype == np.dtype(dtype) and res[key].shape == shape, key
            np.testing.assert_allclose(res[key].astype(np.float64), want, rtol=1e-3, err_msg=key)


@params
def test_reduce_scatter_v_leaves_each_rank_its_uneven_part_reduced(results, world, transport):
    for rank, res in enumerate(results(world, transport)):
        for key, dtype, count, cut in V_CASES:
            a, b = v_bounds(count, cut, world)[rank:rank + 2]
            want = sum(v_input(key, dtype, count, r).astype(np.int64) for r in range(world))
            got = res[f"{key}|rs"]
            assert got.dtype == np.dtype(dtype), key
            np.testing.assert_array_equal(got.astype(np.int64), np.asarray(want)[a:b],
                                          err_msg=key)


@params
def test_all_gather_v_after_reduce_scatter_v_is_the_all_reduce_on_every_rank(
        results, world, transport):
    per_rank = results(world, transport)
    for key, dtype, count, _ in V_CASES:
        want = sum(v_input(key, dtype, count, r).astype(np.int64) for r in range(world))
        np.testing.assert_array_equal(per_rank[0][f"{key}|ag"].astype(np.int64),
                                      np.broadcast_to(want, (count,)), err_msg=key)
        _same_bytes_everywhere(per_rank, f"{key}|ag")


@pytest.mark.parametrize("transport", ["two-hosts", "two-hosts-flat"])
def test_the_halves_cross_hosts_once_in_two_levels(results, transport):
    """4 ranks on two hosts: in two levels, reduce_scatter_v and all_gather_v send nothing on
    the flat ring; across hosts each rank sends the other host's chunk at its local
    position (reduce-scatter) and its own (all-gather). Parts all on one rank go by
    all-reduce instead (a ring would wait on that part at every step): twice the two-level
    all-reduce's bytes, each rank sending its host-level chunk (3001 or 3000 elements of
    6001) once per all-reduce. The flat ring sends on TCP only, between the hosts."""
    world, per_rank = 4, results(4, transport)
    bounds = v_bounds(6001, "even", world)
    sizes = [bounds[r + 1] - bounds[r] for r in range(world)]
    # ranks alternate between the hosts: ring order 0, 2 | 1, 3 (host-major)
    order = [0, 2, 1, 3]
    even = {r: per_rank[r]["v_path_sent_even"].tolist() for r in range(world)}
    front = {r: per_rank[r]["v_path_sent_front"].tolist() for r in range(world)}
    if transport == "two-hosts":
        for pos, r in enumerate(order):
            other = order[(pos + 2) % 4]  # the rank at the same local position on the other host
            assert even[r] == [0, 4 * (sizes[other] + sizes[r])], (r, even)
            host_chunk = 3001 if pos % 2 == 0 else 3000
            assert front[r] == [0, 2 * 4 * host_chunk], (r, front)
    else:
        for sent in (even, front):
            assert all(s[1] == 0 for s in sent.values()), sent  # no cross ring
            assert sum(s[0] for s in sent.values()) > 0, sent
        # 3 steps of a quarter per half for even parts; lopsided: 2 all-reduces of 6 steps
        assert sum(s[0] for s in front.values()) > sum(s[0] for s in even.values())


@params
def test_non_contiguous_async_group_and_ring_interfaces(results, world, transport):
    per_rank = results(world, transport)
    total = world * (world + 1) // 2
    for rank, res in enumerate(per_rank):
        grid = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
        np.testing.assert_array_equal(res["strided"], grid * total)
        assert res["async_done"].tolist() == [True]
        np.testing.assert_array_equal(res["ring_all_reduce"], np.full(6, total))
        np.testing.assert_array_equal(res["ring_all_gather"],
                                      np.repeat(np.arange(world), 2).reshape(world, 2))
        if rank in (0, world - 1):
            np.testing.assert_array_equal(res["group"], np.full(4, 1.0 + world if world > 1
                                                                else 1.0))
        if world > 1:
            np.testing.assert_array_equal(res["recv"],
                                          np.arange(9) + 100 * ((rank - 1) % world))
        want = {"shm": "shm", "tcp": "tcp"}.get(transport, "tcp+shm")
        if (world, transport, rank) == (3, "two-hosts", 1):
            want = "tcp"  # ring 0 -> 2 -> 1: both neighbours of rank 1 are on the other host
        if world > 1:
            assert res["transport"].tolist() == [want]
        assert res["two_level"].tolist() == [(world, transport) == (4, "two-hosts")]
