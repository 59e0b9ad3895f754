"""Worker: all-reduces of arrays made by `comm.shared_array` (reduced in place in shared
memory), mixed with plain all-reduces on the same ring; writes rank<N>.npz."""

from __future__ import annotations

import numpy as np

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
    out["zeroed"] = np.array([all(a.size == 0 or a.flags.writeable for a in arrays)])
    np.savez(f"rank{rank}.npz", **out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
