"""Role makers (Paddle's names): who this process is in the job, read lazily from the worker
env contract (DESIGN.md section 3) or given by the user. Neither opens a connection."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringflow.distributed.env import Endpoint, expand_endpoints, int_var, parse_endpoint
from ringflow.errors import ConfigError

# What Paddle's role maker assumes when PADDLE_TRAINER_ENDPOINTS is not set.
DEFAULT_ENDPOINT = "127.0.0.1:6170"


class Role:
    """Paddle's roles; ringflow has trainers (workers) only, no parameter servers."""

    WORKER = 1
    SERVER = 2


@dataclass(frozen=True)
class _World:
    rank: int
    endpoints: tuple[Endpoint, ...]  # one per rank, per-host lists already expanded
    non_distributed: bool = False


class RoleMakerBase:
    """The getters fleet and the meta-optimizers call. ``_generate_role`` fills in the world
    on first use (Paddle's ``_role_is_generated``), so building a role maker is free."""

    def __init__(self, is_collective: bool = False) -> None:
        if not isinstance(is_collective, bool):
            raise ConfigError(f"is_collective must be a bool, got {is_collective!r}")
        self._is_collective = is_collective
        self._role = Role.WORKER
        self._world_info: _World | None = None

    def _generate_role(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement _generate_role")

    def _world(self) -> _World:
        if self._world_info is None:
            self._generate_role()
        assert self._world_info is not None
        return self._world_info

    def _worker_index(self) -> int:
        return self._world().rank

    def _role_id(self) -> int:
        return self._world().rank

    def _worker_num(self) -> int:
        return len(self._world().endpoints)

    def _get_trainer_endpoints(self) -> list[str]:
        """One ``ip:port`` per rank (not per host: Paddle's pitfall 4 does not apply)."""
        return [str(ep) for ep in self._world().endpoints]

    def _get_current_endpoint(self) -> str:
        world = self._world()
        return str(world.endpoints[world.rank])

    def _node_num(self) -> int:
        """Hosts in the job: distinct IPs among the endpoints, as Paddle counts them."""
        return len({ep.host for ep in self._world().endpoints})

    def _is_worker(self) -> bool:
        return True

    def _is_server(self) -> bool:
        return False

    def _is_first_worker(self) -> bool:
        return self._worker_index() == 0

    def _is_non_distributed(self) -> bool:
        """True when no endpoints were given at all (Paddle: PADDLE_TRAINER_ENDPOINTS unset)."""
        return self._world().non_distributed

    def __repr__(self) -> str:
        if self._world_info is None:
            return f"{type(self).__name__}(is_collective={self._is_collective}, not read yet)"
        return (f"{type(self).__name__}(is_collective={self._is_collective}, rank "
                f"{self._worker_index()} of {self._worker_num()}, endpoints "
                f"{','.join(self._get_trainer_endpoints())})")


class PaddleCloudRoleMaker(RoleMakerBase):
    """The role from the worker env contract, read on first use from ``environ`` (default
    ``os.environ``). Without PADDLE_TRAINER_ENDPOINTS: a world of one at 127.0.0.1:6170.

    The world size is PADDLE_TRAINERS_NUM (else the number of endpoints); endpoints listed
    per host expand to one per rank (port + local rank). ``init_gloo`` is accepted for
    Paddle compatibility and has no effect: fleet's barrier uses the collective world."""

    def __init__(self, is_collective: bool = False, environ: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(is_collective)
        unknown = sorted(set(kwargs) - {"init_gloo"})
        if unknown:
            raise ConfigError(f"PaddleCloudRoleMaker: unknown arguments {unknown}; it takes "
                              "is_collective, environ and init_gloo")
        self._environ = environ

    def _generate_role(self) -> None:
        environ = os.environ if self._environ is None else self._environ
        self._world_info = _world_from_env(environ)


def _world_from_env(environ: Mapping[str, str]) -> _World:
    """The world the env contract describes; an inconsistent variable raises ConfigError
    naming it."""
    role = environ.get("PADDLE_TRAINING_ROLE")
    if role is not None and role != "TRAINER":
        raise ConfigError(f"PADDLE_TRAINING_ROLE={role!r}: expected TRAINER (ringflow has no "
                          "parameter servers)")
    rank = int_var(environ, "PADDLE_TRAINER_ID", 0, default=0)
    var = "PADDLE_TRAINER_ENDPOINTS"
    listed = [parse_endpoint(t, var) for t in environ.get(var, "").split(",") if t.strip()]
    non_distributed = not listed
    if non_distributed:
        listed = [parse_endpoint(DEFAULT_ENDPOINT, var)]
    world = int_var(environ, "PADDLE_TRAINERS_NUM", 1, default=len(listed))
    if non_distributed and world > 1:
        raise ConfigError(f"PADDLE_TRAINERS_NUM={world} but {var} is not set: a world of "
                          "more than one process needs its endpoints")
    if rank >= world:
        raise ConfigError(f"PADDLE_TRAINER_ID={rank} must be < the world size {world} "
                          f"(PADDLE_TRAINERS_NUM, else the number of {var})")
    if world % len(listed):
        raise ConfigError(f"PADDLE_TRAINERS_NUM={world} ranks do not fit the {len(listed)} "
                          f"endpoints of {var}: expected one endpoint per rank or one per host")
    local_size = int_var(environ, "PADDLE_LOCAL_SIZE", 1, default=None)
    endpoints = expand_endpoints(listed, world, var, local_size)
    _check_current(environ, listed, endpoints, rank)
    return _World(rank, endpoints, non_distributed)


def _check_current(environ: Mapping[str, str], listed: list[Endpoint],
                   endpoints: tuple[Endpoint, ...], rank: int) -> None:
    """PADDLE_CURRENT_ENDPOINT (this rank's, or its host's when listed per host) and
    PADDLE_RANK_IN_NODE, when set, must agree with the rank's place in the list."""
    per_host = len(listed) != len(endpoints)
    local_size = len(endpoints) // len(listed)
    expected = listed[rank // local_size] if per_host else endpoints[rank]
    current = environ.get("PADDLE_CURRENT_ENDPOINT", "").strip()
    if current and parse_endpoint(current, "PADDLE_CURRENT_ENDPOINT") != expected:
        raise ConfigError(f"PADDLE_CURRENT_ENDPOINT={current} but rank {rank}'s "
                          f"{'host ' if per_host else ''}endpoint in PADDLE_TRAINER_ENDPOINTS "
                          f"is {expected}")
    local_rank = int_var(environ, "PADDLE_RANK_IN_NODE", 0, default=None)
    if per_host and local_rank is not None and local_rank != rank % local_size:
        raise ConfigError(f"PADDLE_RANK_IN_NODE={local_rank} but rank {rank} is local rank "
                          f"{rank % local_size} of a host running {local_size} ranks")


class UserDefinedRoleMaker(RoleMakerBase):
    """The role given in code: ``current_id`` (rank, default 0), ``worker_endpoints`` (one
    ``ip:port`` per rank, or per host with ``worker_num`` ranks in all), ``role``
    (Role.WORKER only). Checked when built; opens no connection."""

    _KNOWN = ("current_id", "role", "worker_num", "worker_endpoints", "server_endpoints")

    def __init__(self, is_collective: bool = False, init_gloo: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(is_collective)
        unknown = sorted(set(kwargs) - set(self._KNOWN))
        if unknown:
            raise ConfigError(f"UserDefinedRoleMaker: unknown arguments {unknown}; known: "
                              f"{', '.join(self._KNOWN)}")
        self._kwargs = kwargs
        self._generate_role()

    def _generate_role(self) -> None:
        kw = self._kwargs
        if kw.get("role", Role.WORKER) != Role.WORKER or kw.get("server_endpoints"):
            raise ConfigError("UserDefinedRoleMaker: only role=Role.WORKER without "
                              "server_endpoints is supported (ringflow has no parameter "
                              "servers)")
        listed = _listed_endpoints(kw.get("worker_endpoints"))
        world = kw.get("worker_num", len(listed))
        rank = kw.get("current_id", 0)
        for name, value, minimum in (("worker_num", world, 1), ("current_id", rank, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigError(f"UserDefinedRoleMaker: {name}={value!r} must be an int "
                                  f">= {minimum}")
        if rank >= world:
            raise ConfigError(f"UserDefinedRoleMaker: current_id={rank} must be < the world "
                              f"size {world}")
        endpoints = expand_endpoints(listed, world, "UserDefinedRoleMaker worker_endpoints",
                                     None)
        self._world_info = _World(rank, endpoints)


def _listed_endpoints(value: str | Sequence[str] | None) -> list[Endpoint]:
    var = "UserDefinedRoleMaker worker_endpoints"
    if isinstance(value, str):
        value = value.split(",")
    if not value:
        raise ConfigError(f"{var}: give the workers' endpoints, e.g. ['10.0.0.1:6170']")
    return [parse_endpoint(str(t), var) for t in value]
