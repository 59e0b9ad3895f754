"""The worker environment contract (DESIGN.md section 3): job identity, endpoints, env vars.

Endpoints are per rank and host-major. With --base-port P every agent computes every rank's
endpoint alone as `host:P + local rank`; without it (one host only) free ports of this host
are picked below its ephemeral range, at random, so concurrent jobs on one host rarely meet
(and a rank that finds its port taken says which).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from ringflow.launch.config import LaunchConfig
from ringflow.launch.ports import pick_base_port
from ringflow.naming import check_job_id

JOB_ID_VAR = "RINGFLOW_JOB_ID"
JOB_TOKEN_VAR = "RINGFLOW_JOB_TOKEN"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
UPDATE_THREADS_VAR = "RINGFLOW_NUM_THREADS"
BLAS_TIMEOUT_VAR, BLAS_TIMEOUT = "OPENBLAS_THREAD_TIMEOUT", "18"
#: what ranks started on this host by a process with secrets of its own (an Airflow worker:
#: its AIRFLOW__* settings, its AIRFLOW_CONN_* connections) keep of that process's
#: environment: the system's basics and ringflow's own settings (RINGFLOW_HOME, ...); the
#: launcher adds the contract's variables, the job its extra and secret variables
BASE_VARS = ("PATH", "HOME", "LANG", "TMPDIR")
BASE_PREFIXES = ("LC_", "RINGFLOW_")


@dataclass(frozen=True)
class JobIdentity:
    job_id: str
    token: str

    def __repr__(self) -> str:  # the token must not reach a log through a repr
        return f"JobIdentity(job_id={self.job_id!r}, token=<hidden>)"


def resolve_identity(environ: Mapping[str, str]) -> tuple[JobIdentity, str | None]:
    """The job id and token from the environment when both are set, else fresh ones.

    Returns the identity and a warning for the log when only one of the two was set.
    """
    job_id, token = environ.get(JOB_ID_VAR), environ.get(JOB_TOKEN_VAR)
    if job_id and token:
        check_job_id(job_id, JOB_ID_VAR)
        return JobIdentity(job_id, token), None
    warning = None
    if job_id or token:
        present = JOB_ID_VAR if job_id else JOB_TOKEN_VAR
        missing = JOB_TOKEN_VAR if job_id else JOB_ID_VAR
        warning = (f"{present} is set but {missing} is not; using a new job id and token, "
                   "so this agent cannot join other hosts' agents")
    return JobIdentity(secrets.token_hex(6), secrets.token_hex(32)), warning


def minimal_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of `environ` a local job's processes start from (`BASE_VARS`,
    `BASE_PREFIXES`)."""
    return {name: value for name, value in environ.items()
            if name in BASE_VARS or name.startswith(BASE_PREFIXES)}


def plan_endpoints(config: LaunchConfig) -> list[str]:
    """Every rank's `host:port`, in global rank order (host-major)."""
    if config.base_port is not None:
        return [f"{host}:{config.base_port + i}"
                for host in config.hosts for i in range(config.nproc_per_host)]
    # validate() guarantees a single host here
    return [f"{config.host}:{port}" for port in free_ports(config.nproc_per_host)]


def free_ports(count: int) -> list[int]:
    """`count` consecutive ports free on every interface of this host right now, below its
    ephemeral range (`ringflow.launch.ports`): no outgoing connection takes one meanwhile.
    Another process could still bind one before the worker does (then the worker's bind
    fails with an error naming ip:port)."""
    base = pick_base_port(count)
    return list(range(base, base + count))


def cores_available() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_env(config: LaunchConfig, identity: JobIdentity, endpoints: list[str],
               local_rank: int, base: Mapping[str, str]) -> dict[str, str]:
    """The full environment of one worker: `base` plus the contract's variables."""
    rank = config.global_rank(local_rank)
    env = dict(base)
    env.update({
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(config.world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_RANK_IN_NODE": str(local_rank),
        "PADDLE_LOCAL_SIZE": str(config.nproc_per_host),
        "PADDLE_TRAINING_ROLE": "TRAINER",
        "PADDLE_GLOBAL_RANK": str(rank),
        "PADDLE_LOCAL_RANK": str(local_rank),
        "PADDLE_GLOBAL_SIZE": str(config.world_size),
        "PADDLE_NNODES": str(config.nnodes),
        JOB_ID_VAR: identity.job_id,
        JOB_TOKEN_VAR: identity.token,
        "PYTHONUNBUFFERED": "1",
        # a ringflow worker reports when it begins to exit (before its peers can see its
        # rings close and fail in turn), so the launcher names the root cause (logs.py)
        "RINGFLOW_REPORT_EXIT_TIME": "1",
    })
    threads = str(max(1, cores_available() // config.nproc_per_host))
    for var in THREAD_VARS:
        if not base.get(var):
            env[var] = threads
    # the optimizer update runs on as many threads as the rank's BLAS, and OpenBLAS's idle
    # workers sleep 2^18 cycles (~0.1 ms) after a GEMM instead of spinning 2^28 (~0.1 s) on
    # the cores the update wants (README, "Parallel training steps")
    if not base.get(UPDATE_THREADS_VAR):
        env[UPDATE_THREADS_VAR] = env["OPENBLAS_NUM_THREADS"]
    if not base.get(BLAS_TIMEOUT_VAR):
        env[BLAS_TIMEOUT_VAR] = BLAS_TIMEOUT
    return env
