"""The process's rings: ring id -> Communicator. Program ops own ids 0-99 (`c_comm_init` calls
`init_ring`, collective ops call `get_ring(ring_id)`; Paddle's tensor-parallel ids are mp 0,
global 1, dp 2); the Python API's world group (`init_parallel_env`) is ring 100 and
`new_group` takes ids from 101 up.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Sequence

from ringflow.distributed.collective import rendezvous
from ringflow.distributed.collective.communicator import Communicator
from ringflow.distributed.collective.transport.base import blamed_rank, peer_failure_seen
from ringflow.distributed.env import Endpoint, comm_settings
from ringflow.errors import CommError, ConfigError
from ringflow.launch.exits import host_time

PROGRAM_RING_IDS = range(0, 100)
WORLD_RING_ID = 100
FIRST_GROUP_RING_ID = 101

_rings: dict[int, Communicator] = {}
_lock = threading.Lock()
_next_group_id = FIRST_GROUP_RING_ID


def init_ring(ring_id: int, endpoints: Sequence[str | Endpoint], rank: int, nranks: int,
              *, job_id: str | None = None, token: str | None = None,
              two_level: bool | None = None) -> Communicator:
    """Create ring `ring_id` among `endpoints` (one per rank) and register it; every rank of
    the ring calls this. Calling it again with the same members returns the existing ring.
    `two_level` overrides RINGFLOW_TWO_LEVEL for this ring (None: as it says)."""
    with _lock:
        existing = _rings.get(ring_id)
        if existing is not None:
            same = [str(e) for e in existing.endpoints] == [str(e) for e in endpoints]
            if same and existing.rank == rank and existing.nranks == nranks:
                return existing
            raise CommError(f"rank {rank}: ring {ring_id} already exists with other members "
                            f"(rank {existing.rank} of {existing.nranks})")
    job_id = job_id or os.environ.get("RINGFLOW_JOB_ID", "")
    token = token or os.environ.get("RINGFLOW_JOB_TOKEN", "")
    if nranks > 1 and not (job_id and token):
        raise ConfigError("RINGFLOW_JOB_ID and RINGFLOW_JOB_TOKEN must be set to create a ring "
                          "of more than one rank (the launcher sets them)")
    settings = comm_settings()
    if two_level is not None:
        settings = dataclasses.replace(settings, two_level=two_level)
    comm = Communicator(ring_id, endpoints, rank, nranks, job_id, token, settings)
    with _lock:
        _rings[ring_id] = comm
    return comm


def get_ring(ring_id: int) -> Communicator:
    try:
        return _rings[ring_id]
    except KeyError:
        raise CommError(f"ring {ring_id} is not initialised in this process (c_comm_init / "
                        f"init_parallel_env / new_group create rings; known: "
                        f"{sorted(_rings)})") from None


def has_ring(ring_id: int) -> bool:
    return ring_id in _rings


def next_group_ring_id() -> int:
    """The id for the next API group; every rank calls new_group in the same order."""
    global _next_group_id
    with _lock:
        ring_id, _next_group_id = _next_group_id, _next_group_id + 1
        return ring_id


def destroy_ring(ring_id: int, goodbye: bool = True) -> None:
    with _lock:
        comm = _rings.pop(ring_id, None)
    if comm is not None:
        comm.close(goodbye=goodbye)


def destroy_all(goodbye: bool = True) -> None:
    """Close every ring and the listener (sockets, mappings); used at exit too."""
    global _next_group_id
    for ring_id in list(_rings):
        destroy_ring(ring_id, goodbye)
    rendezvous.close_listener()
    _next_group_id = FIRST_GROUP_RING_ID


EXIT_TIME_VAR = "RINGFLOW_REPORT_EXIT_TIME"


def _at_exit() -> None:
    if _rings and os.environ.get(EXIT_TIME_VAR) == "1":
        # For a launcher that names the first rank to fail (ringflow-poprun): the time this
        # rank began to exit, before its peers can see its rings close and fail in turn.
        # "after-peer-failure [R]": this rank saw a peer fail first (global rank R, where
        # known), so it is not the root cause
        blamed = blamed_rank()
        after = (" after-peer-failure" + ("" if blamed is None else f" {blamed}")
                 if peer_failure_seen() else "")
        with contextlib.suppress(OSError, ValueError):  # one write: mpirun tags it whole
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), f"ringflow-exit-time {host_time():.6f}{after}\n"
                     .encode())
    # An uncaught exception (the interpreter recorded it in sys.last_value) is a death, not
    # an orderly exit: close without goodbye so the peers fail fast.
    destroy_all(goodbye=getattr(sys, "last_value", None) is None)


atexit.register(_at_exit)
