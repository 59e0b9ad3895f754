"""The launcher and the collectives together: ranks started by the launcher all-reduce
through ringflow.distributed, and a rank SIGKILLed mid-loop ends the job with that rank
named, in bounded time, with no process and no shm segment left (the `launcher` fixture)."""

from __future__ import annotations

import signal

import pytest

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(90)]

ALLREDUCE = """
    import os, signal, sys
    import numpy as np
    import ringflow.distributed as dist

    steps, victim = int(sys.argv[1]), int(sys.argv[2])
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    expect = world * np.arange(1000, dtype=np.float64) + world * (world - 1) / 2
    for step in range(steps):
        x = np.arange(1000, dtype=np.float64) + rank
        dist.all_reduce(x)
        if not np.array_equal(x, expect):
            print(f"step {step}: wrong sum {x[:3]}")
            sys.exit(5)
        if rank == victim and step == 20:
            how = signal.SIGSTOP if "--stop" in sys.argv else signal.SIGKILL
            print(f"victim gets {how.name} at step 20", flush=True)
            os.kill(os.getpid(), how)
    print(f"{steps} all-reduces ok")
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("world, transport", [
    (2, "auto"), (3, "auto"), (2, "tcp"), (3, "tcp")])
def test_launched_ranks_all_reduce_to_the_same_sums(launcher, world, transport):
    launcher.script("allreduce.py", ALLREDUCE)
    done = launcher.run("--nproc-per-host", str(world), "allreduce.py", "50", "-1",
                        env=launcher.env(RINGFLOW_TRANSPORT=transport), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(done.lines("[rank ")) == [f"{r}] 50 all-reduces ok" for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_rank_sigkilled_mid_all_reduce_ends_the_job_naming_it(launcher, world, transport):
    launcher.script("allreduce.py", ALLREDUCE)
    victim = world - 1
    done = launcher.run("--nproc-per-host", str(world), "allreduce.py", "1000000",
                        str(victim), env=launcher.env(RINGFLOW_TRANSPORT=transport,
                                                      RINGFLOW_COMM_TIMEOUT="20"),
                        timeout=60)
    assert done.returncode == 128 + signal.SIGKILL
    assert done.result["failed_rank"] == victim
    assert f"rank {victim} (local rank {victim}" in done.stdout
    assert "killed by SIGKILL (exit code 137)" in done.stdout
    assert "victim gets SIGKILL at step 20" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_stopped_rank_makes_a_peer_fail_and_the_launcher_ends_the_job(launcher, transport):
    """SIGSTOP: the process lives, its sockets stay open; peers notice the silence after
    RINGFLOW_HEARTBEAT_TIMEOUT, and the launcher then removes the stopped rank too."""
    launcher.script("allreduce.py", ALLREDUCE)
    # The comm deadline is far beyond the heartbeat's, so only the heartbeat can catch it.
    env = launcher.env(RINGFLOW_TRANSPORT=transport, RINGFLOW_COMM_TIMEOUT="60",
                       RINGFLOW_HEARTBEAT_TIMEOUT="3")
    done = launcher.run("--nproc-per-host", "3", "allreduce.py", "1000000", "2", "--stop",
                        env=env, timeout=60)
    assert done.returncode == 1
    assert done.result["failed_rank"] in (0, 1)
    assert "CommError" in done.lines("[launch]   | ")[-1]
    logs = [(launcher.dir / "log" / f"workerlog.{r}").read_text() for r in (0, 1)]
    assert any("failed with peer rank 2 on 127.0.0.1: no heartbeat from rank 2 on 127.0.0.1"
               in log for log in logs), logs
    stopped = done.result["ranks"][2]
    assert stopped["stopped_by_launcher"] and stopped["signal"] == "SIGTERM"
