"""Worker: run the whole collective matrix once and write the results to rank<N>.npz in the
current directory (the test checks them against numpy)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import numpy as np
from tests.runtime.distributed.cases import (
    RS_CASES,
    V_CASES,
    all_reduce_cases,
    make_input,
    rs_input,
    v_bounds,
    v_input,
)

import ringflow.distributed as dist


def run_all_reduces(out: dict) -> None:
    for case in all_reduce_cases():
        x = make_input(case, dist.get_rank())
        y = dist.all_reduce(x, op=getattr(dist.ReduceOp, case.op))
        assert y is x
        out[case.key] = x


def run_v_collectives(out: dict) -> None:
    """reduce_scatter_v then all_gather_v of the same buffer: an all-reduce by halves."""
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = dist.get_ring(dist.get_group().id)
    for key, dtype, count, cut in V_CASES:
        bounds = v_bounds(count, cut, n)
        buf = v_input(key, dtype, count, rank)
        assert comm.reduce_scatter_v(buf, bounds) is buf
        out[f"{key}|rs"] = buf[bounds[rank]:bounds[rank + 1]].copy()
        assert comm.all_gather_v(buf, bounds) is buf
        out[f"{key}|ag"] = buf
    # which links a large pair of halves crossed: bytes this rank sent over TCP on the flat
    # ring and (two levels) on the ring of its local position across hosts; even parts, and
    # parts all on the first rank (too lopsided for a ring: they go by all-reduce)
    flat = getattr(comm._link, "tcp", comm._link)
    cross = getattr(comm.algorithm, "cross", None)
    for cut in ("even", "front"):
        before = [getattr(link, "sent_bytes", 0) for link in (flat, cross)]
        bounds = v_bounds(6001, cut, n)
        buf = v_input("v_path", "float32", 6001, rank)
        comm.reduce_scatter_v(buf, bounds)
        comm.all_gather_v(buf, bounds)
        out[f"v_path_sent_{cut}"] = np.array([getattr(link, "sent_bytes", 0) - b
                                              for link, b in zip((flat, cross), before)])


def run_others(out: dict) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    for src in range(n):
        b = np.full(1003, rank, dtype=np.float32)
        dist.broadcast(b, src=src)
        out[f"bcast_src{src}"] = b
    big = np.arange(6001, dtype=np.int64) * (rank + 1)
    dist.broadcast(big, src=n - 1)
    out["bcast_big"] = big
    for count in (0, 7, 1003):
        gathered: list = []
        dist.all_gather(gathered, np.arange(count, dtype=np.float64) + 1000 * rank)
        out[f"gather{count}"] = np.stack(gathered) if count else np.zeros((n, 0))
    red = np.arange(11, dtype=np.int32) + rank
    dist.reduce(red, dst=n - 1)
    out["reduce"] = red
    target = np.empty(5, dtype=np.float64)
    dist.reduce_scatter(target, [np.full(5, 10.0 * rank + j) for j in range(n)])
    out["reduce_scatter"] = target
    for key, dtype, shape, op in RS_CASES:
        blocks = [rs_input(key, dtype, shape, rank, j) for j in range(n)]
        target = np.empty(shape, dtype=dtype)
        dist.reduce_scatter(target, blocks, op=getattr(dist.ReduceOp, op))
        out[key] = target
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2] * (rank + 1)  # non-contiguous
    dist.all_reduce(grid)
    out["strided"] = grid
    task = dist.all_reduce(np.ones(3) * rank, sync_op=False)
    out["async_done"] = np.array([task.wait(timeout=10)])
    dist.barrier()
    if n > 1:
        msg = np.arange(9, dtype=np.int64) + 100 * rank
        got = np.empty(9, dtype=np.int64)
        if rank % 2 == 0:
            dist.send(msg, dst=(rank + 1) % n)
            dist.recv(got, src=(rank - 1) % n)
        else:
            dist.recv(got, src=(rank - 1) % n)
            dist.send(msg, dst=(rank + 1) % n)
        out["recv"] = got
    group = dist.new_group([0, n - 1])
    if rank in (0, n - 1):
        g = np.full(4, rank + 1.0)
        dist.all_reduce(g, group=group)
        out["group"] = g
    comm = dist.get_ring(dist.get_group().id)
    ring_arr = np.full(6, rank + 1, dtype=np.int64)
    out["ring_all_reduce"] = comm.all_reduce(ring_arr)
    out["ring_all_gather"] = np.stack(comm.all_gather(np.array([rank, rank])))
    out["transport"] = np.array([comm.transport])
    out["two_level"] = np.array([comm.two_level])


def main() -> None:
    dist.init_parallel_env()
    out: dict = {}
    run_all_reduces(out)
    run_all_reduces({})  # a second pass on the same rings: no state leaks between calls
    run_others(out)
    run_v_collectives(out)
    np.savez(f"rank{dist.get_rank()}.npz", **out)
    dist.destroy_process_group()
    print(f"rank {dist.get_rank()} done", flush=True)


if __name__ == "__main__":
    main()
