"""Paddle's collective API on numpy arrays: `init_parallel_env`, groups, and the collectives,
each a thin call into the group's Communicator (ring 100 = the world, 101+ = new_group; ids 0-99
belong to program ops, so a worker may use both in one process).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ringflow.distributed.collective import registry
from ringflow.distributed.collective.communicator import Communicator
from ringflow.distributed.collective.reduce_op import ReduceOp
from ringflow.distributed.env import WorkerEnv, worker_env
from ringflow.errors import CommError, ExecutionError

WORLD_RING_ID = registry.WORLD_RING_ID


@dataclass(frozen=True)
class Group:
    """A set of global ranks; `rank` is this process's index in it, or -1 if not a member."""

    id: int
    ranks: tuple[int, ...]
    rank: int

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    world_size = nranks

    def is_member(self) -> bool:
        return self.rank >= 0

    def get_group_rank(self, global_rank: int) -> int:
        return self.ranks.index(global_rank) if global_rank in self.ranks else -1


class Task:
    """What `sync_op=False` returns. The op has already completed when the call returns
    (the collectives run in the caller's thread), so `wait` returns at once."""

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


_env: WorkerEnv | None = None
_groups: dict[int, Group] = {}


def init_parallel_env() -> Group:
    """Read the env contract (DESIGN.md section 3) and connect the world (ring 100)."""
    global _env
    if _env is None:
        env = worker_env()
        registry.init_ring(WORLD_RING_ID, env.endpoints, env.rank, env.world_size,
                           job_id=env.job_id, token=env.token)
        _env = env
        _groups[WORLD_RING_ID] = Group(WORLD_RING_ID, tuple(range(env.world_size)), env.rank)
    return _groups[WORLD_RING_ID]


def is_initialized() -> bool:
    return _env is not None


def _world() -> WorkerEnv:
    if _env is None:
        raise CommError("call ringflow.distributed.init_parallel_env() before collectives")
    return _env


def get_rank(group: Group | None = None) -> int:
    if group is not None:
        return group.rank
    if _env is not None:
        return _env.rank
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def get_world_size(group: Group | None = None) -> int:
    if group is not None:
        return group.nranks
    if _env is not None:
        return _env.world_size
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def get_group(gid: int = WORLD_RING_ID) -> Group:
    return _groups[gid]


def new_group(ranks: Sequence[int] | None = None, backend: str | None = None) -> Group:
    """A group of global `ranks`; every rank of the world calls it, in the same order."""
    env = _world()
    members = tuple(sorted(set(range(env.world_size) if ranks is None else ranks)))
    if not members or any(not 0 <= r < env.world_size for r in members):
        raise ExecutionError(f"new_group: ranks {list(ranks or [])} must be distinct ranks "
                             f"in 0..{env.world_size - 1}")
    ring_id = registry.next_group_ring_id()
    group = Group(ring_id, members, members.index(env.rank) if env.rank in members else -1)
    if group.is_member():
        registry.init_ring(ring_id, [env.endpoints[r] for r in members], group.rank,
                           len(members), job_id=env.job_id, token=env.token)
    _groups[ring_id] = group
    return group


def _comm(group: Group | None) -> tuple[Group, Communicator | None]:
    if group is None:
        _world()
        group = _groups[WORLD_RING_ID]
    if not group.is_member():
        return group, None  # Paddle: a non-member's call is a no-op
    return group, registry.get_ring(group.id)


def _done(sync_op: bool) -> Task | None:
    return None if sync_op else Task()


def all_reduce(tensor: np.ndarray, op: int = ReduceOp.SUM, group: Group | None = None,
               sync_op: bool = True):
    _, comm = _comm(group)
    if comm is not None:
        comm.all_reduce(tensor, op)
    return tensor if sync_op else Task()


def broadcast(tensor: np.ndarray, src: int, group: Group | None = None, sync_op: bool = True):
    """`src` is a global rank, as in Paddle."""
    grp, comm = _comm(group)
    if comm is not None:
        comm.broadcast(tensor, _group_rank(grp, src, "broadcast src"))
    return tensor if sync_op else Task()


def reduce(tensor: np.ndarray, dst: int, op: int = ReduceOp.SUM, group: Group | None = None,
           sync_op: bool = True):
    grp, comm = _comm(group)
    if comm is not None:
        comm.reduce(tensor, _group_rank(grp, dst, "reduce dst"), op)
    return tensor if sync_op else Task()


def all_gather(tensor_list: list, tensor: np.ndarray, group: Group | None = None,
               sync_op: bool = True):
    """Fills `tensor_list` (cleared first) with every group rank's `tensor`, in rank order."""
    _, comm = _comm(group)
    if comm is not None:
        tensor_list[:] = comm.all_gather(tensor)
    return _done(sync_op)


def reduce_scatter(tensor: np.ndarray, tensor_list: Sequence[np.ndarray],
                   op: int = ReduceOp.SUM, group: Group | None = None, sync_op: bool = True):
    _, comm = _comm(group)
    if comm is not None:
        comm.reduce_scatter(tensor, tensor_list, op)
    return _done(sync_op)


def send(tensor: np.ndarray, dst: int = 0, group: Group | None = None, sync_op: bool = True):
    grp, comm = _comm(group)
    if comm is not None:
        comm.send(tensor, _group_rank(grp, dst, "send dst"))
    return _done(sync_op)


def recv(tensor: np.ndarray, src: int = 0, group: Group | None = None, sync_op: bool = True):
    grp, comm = _comm(group)
    if comm is not None:
        comm.recv(tensor, _group_rank(grp, src, "recv src"))
    return _done(sync_op)


def barrier(group: Group | None = None) -> None:
    _, comm = _comm(group)
    if comm is not None:
        comm.barrier()


def destroy_process_group(group: Group | None = None) -> None:
    """Destroy one group, or (None) every ring, the listener and the world."""
    global _env
    if group is not None:
        registry.destroy_ring(group.id)
        _groups.pop(group.id, None)
        return
    registry.destroy_all()
    _groups.clear()
    _env = None


def _group_rank(group: Group, global_rank: int, what: str) -> int:
    r = group.get_group_rank(global_rank)
    if r < 0:
        raise ExecutionError(f"{what}={global_rank} is not in group {group.id} "
                             f"(ranks {list(group.ranks)})")
    return r
