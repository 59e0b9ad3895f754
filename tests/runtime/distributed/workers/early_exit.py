"""Worker: a rank that finishes early and leaves must not fail a slower neighbour. Three
ranks; each round makes a new group and broadcasts from rank 2 (chain 2 -> 0 -> 1) while
rank 0 dawdles, so rank 2 is done and destroys its side of the ring while rank 1 still waits
for rank 0. Then, on one more group, rank 1 sends to the departed rank 2 (must fail naming it),
and finally rank 2 broadcasts on the world ring and exits for real while rank 0 dawdles."""

from __future__ import annotations

import sys
import time

import numpy as np

import ringflow.distributed as dist
from ringflow.errors import CommError

DAWDLE = 0.3


def broadcast_from_2(group, rank: int, dawdle: float) -> None:
    x = np.full(1000, float(rank))
    if rank == 0:
        time.sleep(dawdle)  # rank 2 finishes and leaves meanwhile; rank 1 waits for us
    dist.broadcast(x, src=2, group=group)
    if not np.all(x == 2.0):
        print(f"rank {rank}: wrong broadcast {x[:3]}", flush=True)
        sys.exit(5)


def main() -> None:
    rounds = int(sys.argv[1])
    dist.init_parallel_env()
    rank = dist.get_rank()
    try:
        for _ in range(rounds):
            group = dist.new_group([0, 1, 2])
            broadcast_from_2(group, rank, DAWDLE)
            dist.destroy_process_group(group)  # rank 2 first: it has nothing left to wait for
        print(f"{rounds} early leaves survived", flush=True)
    except CommError as exc:
        print(f"CommError: {exc}", flush=True)
        sys.exit(17)
    group = dist.new_group([0, 1, 2])
    broadcast_from_2(group, rank, DAWDLE)
    if rank == 2:
        dist.destroy_process_group(group)
    else:
        time.sleep(2 * DAWDLE)  # rank 2 has left this group
        try:
            dist.broadcast(np.zeros(10), src=1, group=group)  # 1 -> 2 -> 0
            print("broadcast to a departed rank did not fail", flush=True)
        except CommError as exc:
            print(f"late use: {exc}", flush=True)
    broadcast_from_2(None, rank, 3 * DAWDLE)  # world ring; rank 2 then exits (atexit)
    print("done", flush=True)


if __name__ == "__main__":
    main()
