"""The worker environment contract of DESIGN.md section 3, parsed into a `WorkerEnv`, and the
collective timeouts (RINGFLOW_*_TIMEOUT) read from the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ringflow.errors import ConfigError
from ringflow.naming import check_job_id


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class WorkerEnv:
    """Who this process is in the job. `endpoints` always holds one endpoint per rank."""

    rank: int
    world_size: int
    endpoints: tuple[Endpoint, ...]
    local_rank: int
    job_id: str
    token: str = field(repr=False)  # a secret: never in a repr or a log

    @property
    def endpoint(self) -> Endpoint:
        return self.endpoints[self.rank]


@dataclass(frozen=True)
class CommSettings:
    """Deadlines of the collectives (seconds)."""

    comm_timeout: float = 300.0
    rendezvous_timeout: float = 120.0
    heartbeat_timeout: float = 20.0
    transport: str = "auto"  # "auto" (shm between ranks of one IP, else tcp) or "tcp"
    # sizes of the algorithms (tests lower them to exercise many rounds)
    segment_bytes: int = 1 << 20     # a TCP ring segment
    slot_bytes: int = 1 << 20        # a shared-memory slot
    # up to this, shared memory hands off in one round; None: by the number of ranks (below)
    shm_small_bytes: int | None = None
    tcp_small_bytes: int = 16 << 10  # up to this, the TCP ring circulates buffers whole
    # a ring of several hosts with several ranks each all-reduces in two levels (twolevel.py)
    two_level: bool = True

    def one_round_bytes(self, ranks: int) -> int:
        """Up to how many bytes ``ranks`` ranks of one host all-reduce in one round (every
        rank reduces the whole buffer from every slot) rather than in rounds of chunks: the
        hand-offs cost more than the extra reduction up to about 1 MiB for 2 ranks and 512
        KiB for 3 or 4 (measured; README "Collectives")."""
        if self.shm_small_bytes is not None:
            return self.shm_small_bytes
        return (1 << 20) if ranks <= 2 else (512 << 10)


_REQUIRED = object()


def int_var(environ: Mapping[str, str], name: str, minimum: int = 0,
            default: object = _REQUIRED) -> int | None:
    """Environment variable ``name`` as an int >= ``minimum``; unset or empty gives
    ``default`` (a ConfigError naming the variable when there is none)."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is _REQUIRED:
            raise ConfigError(f"environment variable {name} is not set; the launcher "
                              "(python -m ringflow.launch) sets it for every worker")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _bool_var(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (environ.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw not in ("0", "1", "true", "false"):
        raise ConfigError(f"{name}={raw!r}: expected 1 or 0")
    return raw in ("1", "true")


def _float_var(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{name}={value} must be a positive number of seconds")
    return value


def parse_endpoint(text: str, var: str) -> Endpoint:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{var}: endpoint {text!r} is not of the form ip:port")
    return Endpoint(host.strip("[]"), int(port))


def expand_endpoints(listed: list[Endpoint], world_size: int, var: str,
                     local_size: int | None) -> tuple[Endpoint, ...]:
    """One endpoint per rank. Per-host style (fewer endpoints than ranks, PopRun's): the ranks
    of host h are contiguous (host-major) and listen on the host's port + local rank."""
    if len(listed) == world_size:
        return tuple(listed)
    nhosts = len(listed)
    if local_size is None:
        if nhosts == 0 or world_size % nhosts:
            raise ConfigError(f"{var} lists {nhosts} endpoints for {world_size} ranks: expected "
                              f"one per rank or one per host (world size divisible by hosts)")
        local_size = world_size // nhosts
    if local_size * nhosts != world_size:
        raise ConfigError(f"{var} lists {nhosts} host endpoints with PADDLE_LOCAL_SIZE="
                          f"{local_size} ranks each, but PADDLE_TRAINERS_NUM={world_size}")
    for ep in listed:
        if ep.port + local_size - 1 > 65535:
            raise ConfigError(f"{var}: host endpoint {ep} with {local_size} ranks per host "
                              f"gives ports {ep.port}..{ep.port + local_size - 1}, beyond 65535")
    return tuple(Endpoint(ep.host, ep.port + i) for ep in listed for i in range(local_size))


def worker_env(environ: Mapping[str, str] | None = None) -> WorkerEnv:
    """Parse the env contract; a missing or invalid variable raises ConfigError naming it."""
    environ = os.environ if environ is None else environ
    world = int_var(environ, "PADDLE_TRAINERS_NUM", minimum=1)
    rank = int_var(environ, "PADDLE_TRAINER_ID")
    if rank >= world:
        raise ConfigError(f"PADDLE_TRAINER_ID={rank} must be < PADDLE_TRAINERS_NUM={world}")
    per_host = len(_listed_endpoints(environ)) != world
    local_rank = int_var(environ, "PADDLE_RANK_IN_NODE") if per_host else \
        int(environ.get("PADDLE_RANK_IN_NODE") or 0)
    endpoints = world_endpoints(environ)
    if per_host:
        _check_local_rank(endpoints, rank, local_rank, environ)
    job_id = environ.get("RINGFLOW_JOB_ID", "")
    token = environ.get("RINGFLOW_JOB_TOKEN", "")
    check_job_id(job_id)
    if not token:
        raise ConfigError("environment variable RINGFLOW_JOB_TOKEN is not set (the job's "
                          "rendezvous secret)")
    return WorkerEnv(rank, world, endpoints, local_rank, job_id, token)


def _listed_endpoints(environ: Mapping[str, str]) -> list[Endpoint]:
    var = "PADDLE_TRAINER_ENDPOINTS"
    listed = [parse_endpoint(t, var) for t in environ.get(var, "").split(",") if t.strip()]
    if not listed:
        raise ConfigError(f"environment variable {var} is not set (comma-separated ip:port)")
    return listed


def world_endpoints(environ: Mapping[str, str]) -> tuple[Endpoint, ...]:
    """One endpoint per global rank, from PADDLE_TRAINER_ENDPOINTS (one per rank, or one per
    host expanded by PADDLE_LOCAL_SIZE) and PADDLE_TRAINERS_NUM."""
    world = int_var(environ, "PADDLE_TRAINERS_NUM", minimum=1)
    local_size = int_var(environ, "PADDLE_LOCAL_SIZE", 1) if environ.get(
        "PADDLE_LOCAL_SIZE") else None
    return expand_endpoints(_listed_endpoints(environ), world, "PADDLE_TRAINER_ENDPOINTS",
                            local_size)


def _check_local_rank(endpoints: tuple[Endpoint, ...], rank: int, local_rank: int,
                      environ: Mapping[str, str]) -> None:
    current = environ.get("PADDLE_CURRENT_ENDPOINT")
    if current:
        host_ep = parse_endpoint(current, "PADDLE_CURRENT_ENDPOINT")
        mine = Endpoint(host_ep.host, host_ep.port + local_rank)
        if mine != endpoints[rank]:
            raise ConfigError(
                f"PADDLE_CURRENT_ENDPOINT={current} + PADDLE_RANK_IN_NODE={local_rank} gives "
                f"{mine}, but rank {rank}'s endpoint in PADDLE_TRAINER_ENDPOINTS is "
                f"{endpoints[rank]}")


def comm_settings(environ: Mapping[str, str] | None = None) -> CommSettings:
    environ = os.environ if environ is None else environ
    transport = (environ.get("RINGFLOW_TRANSPORT") or "auto").strip().lower()
    if transport not in ("auto", "tcp", "shm"):
        raise ConfigError(f"RINGFLOW_TRANSPORT={transport!r}: expected 'tcp' or 'auto'")
    return CommSettings(
        comm_timeout=_float_var(environ, "RINGFLOW_COMM_TIMEOUT", 300.0),
        rendezvous_timeout=_float_var(environ, "RINGFLOW_RENDEZVOUS_TIMEOUT", 120.0),
        heartbeat_timeout=_float_var(environ, "RINGFLOW_HEARTBEAT_TIMEOUT", 20.0),
        transport="tcp" if transport == "tcp" else "auto",
        segment_bytes=int_var(environ, "RINGFLOW_SEGMENT_BYTES", 64, default=1 << 20),
        slot_bytes=int_var(environ, "RINGFLOW_SHM_SLOT_BYTES", 64, default=1 << 20),
        shm_small_bytes=int_var(environ, "RINGFLOW_SHM_SMALL_BYTES", 0, default=None),
        tcp_small_bytes=int_var(environ, "RINGFLOW_TCP_SMALL_BYTES", 0, default=16 << 10),
        two_level=_bool_var(environ, "RINGFLOW_TWO_LEVEL", True),
    )
