"""Failures: a peer killed, stopped or raising mid all-reduce, a wrong job token, a port in use.
Each ends in bounded time with a message naming the ranks, the op and the ring, and leaves no
process and no /dev/shm segment behind."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.runtime.distributed.spawn import free_ports

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]
FAST = {"RINGFLOW_COMM_TIMEOUT": "60", "RINGFLOW_RENDEZVOUS_TIMEOUT": "30"}


def wait_ready(job, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all((job.logs[0].parent / f"ready.{r}").exists() for r in range(n)):
        codes = [p.poll() for p in job.procs]
        assert all(c is None for c in codes), f"a worker ended early {codes}\n{job.output()}"
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.05)


def assert_nothing_left(job) -> None:
    assert job.shm_segments() == []
    for p in job.procs:
        assert p.poll() is not None
        assert not os.path.exists(f"/proc/{p.pid}")  # exited and reaped


def survivors_fail(job, dead: int, n: int, within: float) -> list[str]:
    start = time.monotonic()
    for r in range(n):
        if r != dead:
            job.procs[r].wait(timeout=within + 20)
    elapsed = time.monotonic() - start
    job.kill()  # the stopped or dead one
    codes = [p.returncode for p in job.procs]
    assert all(codes[r] == 17 for r in range(n) if r != dead), (codes, job.output())
    assert elapsed < within, (elapsed, job.output())
    return [job.log(r) for r in range(n)]


@pytest.mark.parametrize("transport", ["shm", "tcp", "two-hosts"])
def test_sigkill_of_a_rank_mid_all_reduce_fails_every_other_rank_within_10s(spawn, transport):
    env = dict(FAST, **({"RINGFLOW_TRANSPORT": "tcp"} if transport == "tcp" else {}))
    n, hosts = 3, None
    if transport == "two-hosts":  # ring order 0 -> 2 (shm) -> 1 (tcp) -> 3 (shm) -> 0 (tcp)
        n, hosts = 4, ["127.0.0.1", "127.0.0.2"] * 2
    job = spawn("loop.py", n, env=env, hosts=hosts)
    wait_ready(job, n)
    job.signal(1, signal.SIGKILL)
    logs = survivors_fail(job, dead=1, n=n, within=10)
    for r in range(n):
        if r == 1:
            continue
        line = next(x for x in logs[r].splitlines() if x.startswith("CommError"))
        assert f"rank {r}" in line and "all_reduce on ring 100" in line and "peer rank" in line
    # a neighbour of the dead rank names it
    assert "peer rank 1" in "".join(logs)
    assert_nothing_left(job)


def test_a_rank_raising_mid_all_reduce_fails_the_others(spawn):
    job = spawn("loop.py", 3, args=["raise-on-1"], env=FAST)
    wait_ready(job, 3)
    logs = survivors_fail(job, dead=1, n=3, within=15)
    assert "ValueError: rank 1 gives up on purpose" in logs[1]
    assert job.procs[1].returncode == 1
    assert_nothing_left(job)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_that_skips_the_collective_times_the_others_out(spawn, transport):
    env = {"RINGFLOW_COMM_TIMEOUT": "2", "RINGFLOW_HEARTBEAT_TIMEOUT": "60"}
    if transport == "tcp":
        env["RINGFLOW_TRANSPORT"] = "tcp"
    job = spawn("loop.py", 2, args=["skip-on-1"], env=env)
    wait_ready(job, 2)
    start = time.monotonic()
    job.procs[0].wait(timeout=30)
    elapsed = time.monotonic() - start
    job.kill()
    assert job.procs[0].returncode == 17, job.output()
    assert elapsed < 10, elapsed
    line = next(x for x in job.log(0).splitlines() if x.startswith("CommError"))
    assert "RINGFLOW_COMM_TIMEOUT" in line and "rank 1" in line and "all_reduce" in line, line
    assert_nothing_left(job)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_stopped_rank_is_detected_by_heartbeat(spawn, transport):
    env = dict(FAST, RINGFLOW_HEARTBEAT_TIMEOUT="2")
    if transport == "tcp":
        env["RINGFLOW_TRANSPORT"] = "tcp"
    job = spawn("loop.py", 2, env=env)
    wait_ready(job, 2)
    job.signal(1, signal.SIGSTOP)
    start = time.monotonic()
    job.procs[0].wait(timeout=30)
    elapsed = time.monotonic() - start
    job.kill()
    assert job.procs[0].returncode == 17, job.output()
    assert 1.0 <= elapsed < 15, elapsed  # by the heartbeat timeout, not by luck or deadline
    line = next(x for x in job.log(0).splitlines() if x.startswith("CommError"))
    assert "peer rank 1" in line and ("heartbeat" in line or "stopped" in line), line
    assert_nothing_left(job)


def test_a_wrong_job_token_is_refused_and_logged_without_the_token(spawn):
    env = {"RINGFLOW_RENDEZVOUS_TIMEOUT": "3"}
    job = spawn("loop.py", 2, env=env,
                per_rank_env={1: {"RINGFLOW_JOB_TOKEN": "not-the-job-token-0123456789"}})
    codes = job.wait(timeout=30)
    assert codes == [17, 17], job.output()
    out = job.output()
    # the first rank to dial the other finds it cannot prove the token, and names it
    assert "could not prove it holds this job's token" in out
    assert job.token not in out and "not-the-job-token-0123456789" not in out
    assert_nothing_left(job)


def test_a_port_in_use_is_an_error_naming_ip_and_port(spawn):
    ports = free_ports(2)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", ports[0]))
        squatter.listen(1)
        job = spawn("loop.py", 2, env={"RINGFLOW_RENDEZVOUS_TIMEOUT": "3"}, ports=ports)
        codes = job.wait(timeout=30)
    assert codes[0] == 17, job.output()
    assert f"cannot listen on 127.0.0.1:{ports[0]}: address already in use" in job.log(0)
    assert_nothing_left(job)
