"""Start N real worker processes with the env contract (DESIGN.md section 3), each in its own
process group, and always reap them. A small stand-in for `python -m ringflow.launch` so the
collective tests do not depend on the launcher.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ringflow.launch.env import free_ports as launcher_free_ports

WORKERS = Path(__file__).parent / "workers"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` consecutive ports free on every address, below the machine's ephemeral range:
    the launcher's own choice (`ringflow.launch.env.free_ports`). A port from that range that
    is free now can become the local end of a connection another process (another test
    worker's job) opens before the rank binds it."""
    return launcher_free_ports(count)


def contract_env(rank: int, endpoints: list[str], job_id: str, token: str,
                 extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    env.update({
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(len(endpoints)),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_RANK_IN_NODE": str(rank),
        "PADDLE_LOCAL_SIZE": str(len(endpoints)),
        "PADDLE_TRAINING_ROLE": "TRAINER",
        "RINGFLOW_JOB_ID": job_id,
        "RINGFLOW_JOB_TOKEN": token,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


@dataclass
class Job:
    job_id: str
    token: str
    procs: list[subprocess.Popen]
    logs: list[Path]
    endpoints: list[str]
    ended: list[int | None] = field(default_factory=list)

    def wait(self, timeout: float) -> list[int]:
        """Exit codes of every worker; raises TimeoutError (after killing) past `timeout`."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise TimeoutError(f"workers still running after {timeout} s:\n"
                                   + self.output()) from None
        return [p.returncode for p in self.procs]

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text(errors="replace")

    def output(self) -> str:
        return "\n".join(f"--- rank {r} ---\n{self.log(r)}" for r in range(len(self.procs)))

    def signal(self, rank: int, sig: int) -> None:
        os.killpg(self.procs[rank].pid, sig)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=10)

    def shm_segments(self) -> list[str]:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"ringflow-{self.job_id}-"))


class Spawner:
    """Factory behind the `spawn` fixture; `close()` kills and reaps everything it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.jobs: list[Job] = []

    def __call__(self, worker: str, nprocs: int, args: list[str] | None = None,
                 env: dict[str, str] | None = None, hosts: list[str] | None = None,
                 per_rank_env: dict[int, dict[str, str]] | None = None,
                 ports: list[int] | None = None) -> Job:
        hosts = hosts or ["127.0.0.1"] * nprocs
        # held open together, so distinct; a port free on 127.0.0.1 serves any 127.x too
        endpoints = [f"{h}:{p}" for h, p in zip(hosts, ports or free_ports(nprocs))]
        job = Job(secrets.token_hex(4), secrets.token_hex(16), [], [], endpoints)
        self.jobs.append(job)
        for rank in range(nprocs):
            extra = {**(env or {}), **(per_rank_env or {}).get(rank, {})}
            log = self.tmp / f"{job.job_id}.rank{rank}.log"
            with open(log, "wb") as out:
                job.procs.append(subprocess.Popen(
                    [sys.executable, str(WORKERS / worker), *(args or [])],
                    env=contract_env(rank, endpoints, job.job_id, job.token, extra),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, cwd=self.tmp))
            job.logs.append(log)
        return job

    def close(self) -> None:
        for job in self.jobs:
            job.kill()
            for name in job.shm_segments():  # what the launcher's sweep would do
                os.unlink(os.path.join("/dev/shm", name))
