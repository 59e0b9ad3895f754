"""Worker: a rank that finishes early and leaves must not fail a slower neighbour. Three
ranks; each round makes a new group and broadcasts from rank 2 (chain 2 -> 0 -> 1), and
rank 1 joins the broadcast only once rank 2 has destroyed its side of the ring (a file in
the shared working directory says so), so rank 2 is gone while rank 0, its neighbour, is
still inside the broadcast, waiting to hand the data on to rank 1. Then, on two more groups,
ranks 0 and 1 use the departed rank 2 (must fail naming it), and finally rank 2 broadcasts
on the world ring and exits for real before rank 1 takes part. The order is made by these
marks, not by sleeps; each wait has a deadline.

That order exists over TCP, whose sockets buffer rank 2's data. Over shared memory (the
`auto` transport on one host) a broadcast is one synchronous round: every rank posts, then
the others copy out of the root's slot, so no rank can finish before all have joined, and
rank 1 cannot wait for rank 2's departure inside it. There the root returns first (it copies
nothing) and leaves while the others still read its slot: the test runs that natural order
and checks that nothing fails (the departure marks are then only written, not waited for,
except before the uses of the departed rank)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import ringflow.distributed as dist
from ringflow.errors import CommError

WAIT_S = 30.0
# Only TCP lets rank 2 complete a broadcast before rank 1 has joined it (see above).
GATED = os.environ.get("RINGFLOW_TRANSPORT") == "tcp"


def mark(name: str) -> None:
    with open(f"{name}.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(f"{name}.tmp", name)


def wait_for(name: str) -> int:
    """The pid written into mark `name`, once it exists."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(name):
        if time.monotonic() > deadline:
            print(f"rank {dist.get_rank()}: no mark {name!r} within {WAIT_S} s", flush=True)
            sys.exit(9)
        time.sleep(0.005)
    with open(name) as f:
        return int(f.read())


def wait_gone(pid: int) -> None:
    """Until process `pid` has exited (gone, or a zombie its parent did not reap yet)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            return
        if stat[stat.rfind(")") + 2] in "ZX":
            return
        time.sleep(0.005)
    print(f"rank {dist.get_rank()}: pid {pid} still running after {WAIT_S} s", flush=True)
    sys.exit(9)


def broadcast_from_2(group, rank: int, after: str | None) -> None:
    """Rank 2's broadcast; rank 1 joins only after mark `after` (rank 2 left)."""
    x = np.full(1000, float(rank))
    if rank == 1 and after is not None and GATED:
        wait_for(after)
    dist.broadcast(x, src=2, group=group)
    if not np.all(x == 2.0):
        print(f"rank {rank}: wrong broadcast {x[:3]}", flush=True)
        sys.exit(5)


def main() -> None:
    rounds = int(sys.argv[1])
    dist.init_parallel_env()
    rank = dist.get_rank()
    try:
        for i in range(rounds):
            group = dist.new_group([0, 1, 2])
            broadcast_from_2(group, rank, f"left-{i}")
            dist.destroy_process_group(group)  # rank 2 first: it has nothing left to wait for
            if rank == 2:
                mark(f"left-{i}")
        print(f"{rounds} early leaves survived", flush=True)
    except CommError as exc:
        print(f"CommError: {exc}", flush=True)
        sys.exit(17)
    # One group for each late use: a rank whose op fails drops that group's connections at
    # once, which the other rank would otherwise see before rank 2's departure.
    late = [dist.new_group([0, 1, 2]) for _ in range(2)]
    for group in late:
        broadcast_from_2(group, rank, None)    # connected
    if rank == 2:
        for group in late:
            dist.destroy_process_group(group)
        mark("left-last")
    else:
        wait_for("left-last")                 # rank 2 has left these groups
        try:
            # 1 -> 2 -> 0: rank 1 sends to rank 2, rank 0 waits for it, each on its own group
            dist.broadcast(np.zeros(10), src=1, group=late[rank])
            print("broadcast to a departed rank did not fail", flush=True)
        except CommError as exc:
            print(f"late use: {exc}", flush=True)
    if rank == 2:
        mark("exiting")
        broadcast_from_2(None, rank, None)     # world ring; then exits (atexit closes it)
    else:
        if rank == 1 and GATED:
            wait_gone(wait_for("exiting"))     # rank 2 has exited for real
        broadcast_from_2(None, rank, None)
    print("done", flush=True)


if __name__ == "__main__":
    main()
