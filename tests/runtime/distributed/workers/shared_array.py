"""Worker: all-reduces of arrays made by `comm.shared_array` (reduced in place in shared
memory), mixed with plain all-reduces on the same ring; writes rank<N>.npz."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import numpy as np
from tests.runtime.distributed.cases import v_bounds

import ringflow.distributed as dist

CASES = [(0, "float32"), (1, "float32"), (7, "int64"), (1003, "float64"),
         (300_001, "float32"), (140_000, "int64"), (200_000, "float64")]


def main() -> None:
    dist.init_parallel_env()
    rank = dist.get_rank()
    comm = dist.get_ring(dist.get_group().id)
    out = {}
    arrays = [comm.shared_array(count, dtype) for count, dtype in CASES]
    for step in range(3):  # the same arrays again: the hand-offs leave nothing behind
        for (count, dtype), arr in zip(CASES, arrays):
            arr[...] = (np.arange(count) % 1000 + 1) * (rank + 1 + step)
            assert comm.all_reduce(arr) is arr
            out[f"{count}-{dtype}-{step}"] = arr.copy()
        plain = np.full(5000, rank + 1.0)
        dist.all_reduce(plain)
        out[f"plain-{step}"] = plain
    for count, dtype in CASES:   # the sharded step's halves, where the arrays lie
        arr = comm.shared_array(count, dtype)
        for cut in ("even", "skewed", "back"):
            bounds = v_bounds(count, cut, comm.nranks)
            arr[...] = (np.arange(count) % 1000 + 1) * (rank + 1)
            assert comm.reduce_scatter_v(arr, bounds) is arr
            out[f"v-{count}-{dtype}-{cut}-rs"] = arr[bounds[rank]:bounds[rank + 1]].copy()
            assert comm.all_gather_v(arr, bounds) is arr
            out[f"v-{count}-{dtype}-{cut}-ag"] = arr.copy()
    out["zeroed"] = np.array([all(a.size == 0 or a.flags.writeable for a in arrays)])
    np.savez(f"rank{rank}.npz", **out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
