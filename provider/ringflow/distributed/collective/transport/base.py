"""What every transport shares: the ``Link`` interface the ring algorithm is written
against, the op context that errors name, deadlines, and the spin-then-back-off wait that
lets 4 ranks progress on 2 cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ringflow.errors import CommError, CommTimeoutError

# Busy-polling hands off in ~0.4 us here; after this many polls a waiter yields the core,
# and after _YIELD_POLLS more it sleeps with a growing nap, so oversubscribed ranks progress.
_SPIN_POLLS = 2000
_YIELD_POLLS = 200
_MAX_NAP = 0.0005
_spin_polls, _yield_polls = _SPIN_POLLS, _YIELD_POLLS
# Liveness checks cost syscalls; do them only this often while waiting.
_CHECK_EVERY = 0.05
# Set once this process saw a comm error that blames a peer (died, left, silent, refused):
# if it now fails, that is most likely a consequence of the peer's failure, which a
# launcher naming the root cause wants to know (registry.py reports it at exit).
_peer_failure_seen = False
# ... and the global rank of the first peer it blamed, where known (the launcher names that
# rank's host as the likely root cause when this rank's own failure followed)
_blamed_rank: int | None = None


def peer_failure_seen() -> bool:
    return _peer_failure_seen


def blamed_rank() -> int | None:
    """The global rank of the first peer a comm error of this process blamed, if known."""
    return _blamed_rank


@dataclass
class OpContext:
    """Where a comm error happened: this rank, the ring, the op. Set per collective call.

    ``names`` holds, by position in the ring, how an error names that rank: its global rank
    and host (``rank 2 on 10.77.0.2``), with the ring position only in addition where the
    two differ; a user reads global ranks in the launcher's lines, never ring positions."""

    rank: int
    ring_id: int
    op: str = "init"
    host: str = ""
    names: tuple[str, ...] = ()
    global_ranks: tuple[int, ...] = ()  # by position, where the world's endpoints are known

    def name(self, position: int | None) -> str:
        """How errors name the rank at `position` of this ring."""
        if position is None:
            return "a peer"
        if 0 <= position < len(self.names):
            return self.names[position]
        return f"rank {position}"

    def error(self, peer: int | None, cause: str, timeout: bool = False) -> CommError:
        global _peer_failure_seen, _blamed_rank
        if peer is not None:
            _peer_failure_seen = True
            if _blamed_rank is None and 0 <= peer < len(self.global_ranks):
                _blamed_rank = self.global_ranks[peer]
        who = self.name(self.rank) if self.names else (
            f"rank {self.rank}" + (f" ({self.host})" if self.host else ""))
        peer_txt = f" with peer {self.name(peer)}" if peer is not None else ""
        cls = CommTimeoutError if timeout else CommError
        return cls(f"{who}: {self.op} on ring {self.ring_id} failed{peer_txt}: {cause}")


def global_ranks(endpoints: Sequence[object], world: Sequence[object] | None
                 ) -> tuple[int, ...]:
    """Each ring member's global rank: its index among the world's endpoints (() when the
    world is not known or a member is not in it: a ring made by hand)."""
    index = {str(e): g for g, e in enumerate(world or ())}
    ranks = tuple(index.get(str(e), -1) for e in endpoints)
    return () if -1 in ranks else ranks


def rank_names(ring_id: int, endpoints: Sequence[object], world: Sequence[object] | None
               ) -> tuple[str, ...]:
    """``names`` of an OpContext: each ring member by its global rank (its index among the
    world's endpoints, when known) and host, plus its ring position where that differs."""
    ranks = global_ranks(endpoints, world) or tuple(range(len(endpoints)))
    names = []
    for position, (endpoint, rank) in enumerate(zip(endpoints, ranks)):
        host = getattr(endpoint, "host", None) or str(endpoint).rpartition(":")[0]
        extra = f" (position {position} in ring {ring_id})" if rank != position else ""
        names.append(f"rank {rank} on {host}{extra}")
    return tuple(names)


def byte_view(arr: np.ndarray) -> memoryview:
    """A contiguous array's bytes, as links send and receive them."""
    return memoryview(arr).cast("B") if arr.size else memoryview(b"")


class Link(Protocol):
    """One rank's place in a ring: it sends to its right neighbour and receives from its
    left one, each call bounded by a deadline (ring.py's algorithms use nothing else).
    ``check`` raises the CommError a watchdog saw; ``close`` ends the link, in order
    (``goodbye``) after the last op or abruptly after a failure."""

    def send(self, data: memoryview, deadline: Deadline) -> None: ...

    def recv_into(self, view: memoryview, deadline: Deadline) -> None: ...

    def check(self) -> None: ...

    def close(self, goodbye: bool = True) -> None: ...


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() >= self.at


def note_local_ranks(count: int) -> None:
    """Ranks of this host that wait on each other. When they outnumber the cores, a waiter
    spins only briefly: the peer it waits for needs the core it would burn."""
    global _spin_polls, _yield_polls
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if count > (cores or 1):
        _spin_polls, _yield_polls = 20, 5000


def spin_wait(ready: Callable[[], bool], deadline: Deadline,
              check: Callable[[], None], what: Callable[[], str],
              ctx: OpContext, peer: Callable[[], int | None]) -> None:
    """Return once `ready()`; poll fast, then yield, then nap. `check()` raises on a dead
    peer; past the deadline a CommTimeoutError names `what()` we waited for."""
    for _ in range(_spin_polls):
        if ready():
            return
    polls = 0
    nap = 0.00005
    next_check = 0.0
    while not ready():
        now = time.monotonic()
        if now >= next_check:
            try:
                check()
            except CommError:
                if ready():  # the peer met this wait before it went
                    return
                raise
            if now >= deadline.at:
                raise ctx.error(peer(), f"no progress for {deadline.seconds:g} s "
                                f"(RINGFLOW_COMM_TIMEOUT) waiting for {what()}", timeout=True)
            next_check = now + _CHECK_EVERY
        polls += 1
        if polls < _yield_polls:
            os.sched_yield()
        else:
            time.sleep(nap)
            nap = min(nap * 2, _MAX_NAP)


def process_state(pid: int) -> str | None:
    """The state letter of a local process (R, S, T, Z, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name in parentheses may contain spaces; the state follows the last ')'
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3].decode()
