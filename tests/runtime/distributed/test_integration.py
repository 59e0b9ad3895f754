"""The collectives started the two ways a job starts: by `python -m ringflow.launch`, and with
PopRun-style per-host endpoints (one endpoint per host, port + PADDLE_RANK_IN_NODE)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.runtime.distributed.spawn import WORKERS, free_ports

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]


def test_ranks_started_by_the_launcher_all_reduce_over_shared_memory(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ringflow.launch", "--nproc-per-host", "3",
                           "--log-dir", str(tmp_path / "log"), str(WORKERS / "hello.py")],
                          capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(3):
        assert f"[rank {r}] rank {r} of 3 sum 6 transport shm" in done.stdout


def _two_free_consecutive_ports() -> int:
    for port in free_ports(20):
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def test_per_host_endpoints_make_each_rank_listen_on_port_plus_local_rank(spawn):
    port = _two_free_consecutive_ports()
    host_style = {"PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{port}",
                  "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{port}"}
    job = spawn("hello.py", 2, env=host_style)
    assert job.wait(timeout=60) == [0, 0], job.output()
    for r in range(2):
        assert f"rank {r} of 2 sum 3 transport shm listens 127.0.0.1:{port + r}" in job.log(r)
