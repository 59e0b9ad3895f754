"""Failure behaviour: the first failing rank stops the job and is reported as the root cause;
signals to the launcher stop everything; a SIGKILLed launcher takes its workers and their
children with it; a crashed rank's shm segments are removed. The `launcher` fixture fails any
test that leaves a process or a segment behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests import procs

from .conftest import wait_for

pytestmark = pytest.mark.timeout(60)

# A rank that records its pid and its child's, then waits: the victim of a stop.
SLEEPER = """
    import json, os, signal, subprocess, sys, time
    rank = os.environ["PADDLE_TRAINER_ID"]
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the child inherits it too
    if "--note-term" in sys.argv:  # survives SIGTERM, but says it got one
        signal.signal(signal.SIGTERM, lambda *_: open(f"term.{rank}", "w").close())
    child = subprocess.Popen(["sleep", "1000"])
    with open(f"pids.{rank}.tmp", "w") as f:
        f.write(json.dumps({"worker": os.getpid(), "child": child.pid}) + "\\n")
    os.rename(f"pids.{rank}.tmp", f"pids.{rank}")
    print("ready", flush=True)
    time.sleep(1000)
"""


def wait_ready(launcher, ranks) -> list[int]:
    """Every pid (workers and their children) once all `ranks` are up."""
    pids = []
    for r in ranks:
        info = launcher.read_json(f"pids.{r}")
        pids += [info["worker"], info["child"]]
    return pids


def sleeper_unless(launcher, rank: int, body: str) -> None:
    """Rank `rank` runs `body`; the others run SLEEPER."""
    launcher.script("sleeper.py", SLEEPER)
    launcher.script("worker.py", f"""
        import os, runpy, sys
        if os.environ["PADDLE_TRAINER_ID"] != "{rank}":
            runpy.run_path("sleeper.py", run_name="__main__")
        """ + body)


@pytest.mark.multiproc
def test_a_failing_rank_stops_the_others_and_its_code_and_log_tail_are_reported(launcher):
    sleeper_unless(launcher, 1, """
        import time
        while not all(os.path.exists(f"pids.{r}") for r in (0, 2)):
            time.sleep(0.02)
        for i in range(1, 31):
            print(f"progress {i}")
        sys.exit(3)
    """)
    done = launcher.run("--nproc-per-host", "3", "worker.py")
    assert done.returncode == 3
    assert "rank 1 (local rank 1, host 127.0.0.1" in done.stdout
    assert "failed first: exit code 3; stopping the other ranks" in done.stdout
    tail = [ln.removeprefix("  | ") for ln in done.lines("[launch] ") if ln.startswith("  | ")]
    assert tail == [f"progress {i}" for i in range(11, 31)]
    result = done.result
    assert (result["status"], result["failed_rank"], result["exit_code"]) == ("failed", 1, 3)
    by_rank = {r["rank"]: r for r in result["ranks"]}
    for r in (0, 2):
        assert by_rank[r]["signal"] == "SIGTERM" and by_rank[r]["stopped_by_launcher"]
    assert not by_rank[1]["stopped_by_launcher"]


@pytest.mark.multiproc
def test_a_rank_killed_by_a_signal_makes_the_launcher_exit_128_plus_the_signal(launcher):
    sleeper_unless(launcher, 0, """
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = launcher.run("--nproc-per-host", "2", "worker.py")
    assert done.returncode == 137
    assert "rank 0 (local rank 0" in done.stdout
    assert "killed by SIGKILL (exit code 137)" in done.stdout
    assert done.result["ranks"][0]["signal"] == "SIGKILL"


@pytest.mark.multiproc
def test_the_first_failure_is_the_root_cause_and_later_failures_are_listed(launcher):
    launcher.script("worker.py", """
        import os, signal, sys, time
        if os.environ["PADDLE_TRAINER_ID"] == "0":
            # fails as a consequence, like a rank whose peer vanished
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
            open("armed", "w").close()
            time.sleep(1000)
        while not os.path.exists("armed"):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = launcher.run("--nproc-per-host", "2", "worker.py")
    assert done.returncode == 137
    assert done.result["failed_rank"] == 1
    first, second = done.result["ranks"]
    assert (first["exit_code"], first["signal"]) == (1, None)
    assert (second["exit_code"], second["signal"]) == (137, "SIGKILL")
    assert second["ended_at"] <= first["ended_at"]


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_rank_ignoring_sigterm_is_killed_after_the_grace(launcher):
    sleeper_unless(launcher, 1, """
        import time
        while not os.path.exists("pids.0"):
            time.sleep(0.02)
        sys.exit(1)
    """)
    done = launcher.run("--nproc-per-host", "2", "worker.py", "--ignore-term", timeout=40)
    assert done.returncode == 1
    assert "rank 0 still running 5 s after SIGTERM: sending SIGKILL" in done.stdout
    stubborn = done.result["ranks"][0]
    assert stubborn["signal"] == "SIGKILL" and stubborn["stopped_by_launcher"]
    assert done.result["failed_rank"] == 1


@pytest.mark.multiproc
def test_a_stopped_rank_gets_sigterm_delivered_not_held_until_the_grace_ends(launcher):
    launcher.script("worker.py", """
        import os, signal, sys, time
        if os.environ["PADDLE_TRAINER_ID"] == "0":
            with open("stopping.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename("stopping.tmp", "stopping")
            os.kill(os.getpid(), signal.SIGSTOP)  # a silent hang, as a debugger would leave it
            time.sleep(1000)
        deadline = time.monotonic() + 20
        while not os.path.exists("stopping") and time.monotonic() < deadline:
            time.sleep(0.005)
        stat = f"/proc/{open('stopping').read()}/stat"
        # fail only once rank 0 is really stopped (state T), so the case is reached
        while open(stat).read().rsplit(")", 1)[1].split()[0] != "T":
            if time.monotonic() > deadline:
                sys.exit(9)
            time.sleep(0.005)
        sys.exit(2)
    """)
    done = launcher.run("--nproc-per-host", "2", "worker.py")
    assert done.returncode == 2
    assert done.result["ranks"][0]["signal"] == "SIGTERM"
    assert "sending SIGKILL" not in done.stdout


@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_rank_and_their_children(launcher, sig):
    launcher.script("sleeper.py", SLEEPER)
    proc = launcher.start("--nproc-per-host", "2", "sleeper.py")
    pids = wait_ready(launcher, (0, 1))
    os.kill(proc.pid, sig)
    done = launcher.finish(proc)
    assert done.returncode == 128 + sig
    assert f"the launcher received {sig.name}; stopping all ranks" in done.stdout
    assert done.result["status"] == "stopped"
    assert procs.alive(pids) == []


@pytest.mark.multiproc
def test_a_second_signal_to_the_launcher_kills_at_once_without_the_grace(launcher):
    launcher.script("sleeper.py", SLEEPER)
    proc = launcher.start("--nproc-per-host", "2", "sleeper.py", "--note-term")
    pids = wait_ready(launcher, (0, 1))
    os.kill(proc.pid, signal.SIGTERM)
    wait_for(lambda: (launcher.dir / "term.0").exists(), 10.0, "rank 0 to get SIGTERM")
    os.kill(proc.pid, signal.SIGINT)
    done = launcher.finish(proc)
    assert done.returncode == 128 + signal.SIGTERM  # the first signal is the cause
    assert "signalled again: killing all ranks now" in done.stdout
    assert [r["signal"] for r in done.result["ranks"]] == ["SIGKILL", "SIGKILL"]
    assert procs.alive(pids) == []


@pytest.mark.multiproc
def test_a_sigkilled_launcher_takes_its_workers_their_children_and_shm_with_it(launcher):
    launcher.script("sleeper.py", SLEEPER)
    segment = Path(f"/dev/shm/ringflow-{launcher.job_id}-ring0-0a1b2c3d4e-p0")
    proc = launcher.start("--nproc-per-host", "2", "sleeper.py")
    pids = wait_ready(launcher, (0, 1))
    segment.write_bytes(b"left by a rank")
    proc.kill()
    proc.communicate(timeout=10)
    wait_for(lambda: not procs.alive(pids), 10.0, "workers and children to die")
    wait_for(lambda: not segment.exists(), 10.0, f"{segment} to be removed")


@pytest.mark.multiproc
@pytest.mark.parametrize("code", [0, 1])
def test_shm_segments_of_the_job_are_removed_when_it_ends_and_no_others(launcher, code):
    other = Path(f"/dev/shm/ringflow-{launcher.job_id}x-seg")  # another job's id
    other.write_bytes(b"other job")
    try:
        launcher.script("leaky.py", f"""
            import os, sys
            rank = os.environ["PADDLE_TRAINER_ID"]
            job = os.environ["RINGFLOW_JOB_ID"]
            with open(f"/dev/shm/ringflow-{{job}}-seg{{rank}}", "wb") as f:
                f.write(b"x" * 4096)
            while not all(os.path.exists(f"/dev/shm/ringflow-{{job}}-seg{{r}}") for r in "01"):
                pass  # both crash with their segment made
            sys.exit({code})
        """)
        done = launcher.run("--nproc-per-host", "2", "leaky.py")
        assert done.returncode == code
        assert done.result["shm_removed"] == [f"ringflow-{launcher.job_id}-seg0",
                                              f"ringflow-{launcher.job_id}-seg1"]
        assert list(Path("/dev/shm").glob(f"ringflow-{launcher.job_id}-*")) == []
        assert other.read_bytes() == b"other job"
    finally:
        other.unlink()


@pytest.mark.multiproc
def test_a_daemonized_descendant_that_left_its_group_is_killed_at_the_end(launcher):
    launcher.script("daemon.py", """
        import os, time
        if os.fork() == 0:
            os.setsid()  # leaves the rank's process group: killpg cannot reach it
            if os.fork() == 0:
                with open("daemon.pid.tmp", "w") as f:
                    f.write(f"{os.getpid()}\\n")
                os.rename("daemon.pid.tmp", "daemon.pid")
                time.sleep(1000)
            os._exit(0)
        while not os.path.exists("daemon.pid"):
            time.sleep(0.02)
    """)
    done = launcher.run("--nproc-per-host", "1", "daemon.py")
    assert done.returncode == 0, done.stdout + done.stderr
    daemon = int((launcher.dir / "daemon.pid").read_text())
    assert "left its process group" in done.stdout
    wait_for(lambda: not procs.alive([daemon]), 5.0, "the daemon to die")


@pytest.mark.multiproc
def test_the_rank_that_began_to_exit_first_is_the_root_cause_though_a_peer_ends_before_it(
        launcher):
    """Rank 1 raises; on its way out it closes its rings (so rank 0 fails and ends at once)
    and then takes 2 s more to end (an atexit handler of its own, run after ringflow's). The
    launcher names rank 1: it reported when it began to exit, before rank 0 could fail."""
    launcher.script("worker.py", """
        import atexit, os, time
        rank = int(os.environ["PADDLE_TRAINER_ID"])
        if rank == 1:
            atexit.register(time.sleep, 2.0)  # registered before ringflow's: runs after it
        import numpy as np
        import ringflow.distributed as dist
        dist.init_parallel_env()
        for i in range(1000000):
            dist.all_reduce(np.ones(1024))
            if rank == 1 and i == 20:
                raise ValueError("rank 1 gives up on purpose")
    """)
    done = launcher.run("--nproc-per-host", "2", "--log-dir", "logs", "worker.py", timeout=60)
    result = done.result
    assert (result["status"], result["failed_rank"], result["exit_code"]) == ("failed", 1, 1), \
        done.stdout
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[0]["exit_code"] != 0 and not by_rank[0]["stopped_by_launcher"], done.stdout
    assert by_rank[1]["ended_at"] < by_rank[0]["ended_at"]
    assert "rank 1 (local rank 1, host 127.0.0.1" in done.stdout
    log = (launcher.dir / "logs" / "workerlog.1").read_text()
    assert "ValueError: rank 1 gives up on purpose" in log
    assert "ringflow-exit-time" not in done.stdout + log  # for the launcher, not for people


@pytest.mark.multiproc
def test_a_rank_that_failed_because_a_rank_here_failed_is_not_the_root_cause_though_first(
        launcher):
    """Rank 1 saw rank 3 (another host's) go silent and closed its rings; rank 0 saw rank 1's
    ring close and began to exit a second before rank 1 did (their clocks raced). Both failed
    after a peer; rank 0 blamed rank 1, which failed here: the launcher follows the blame to
    rank 1, whose log says what the job lost."""
    launcher.script("worker.py", """
        import os, sys, time
        rank = int(os.environ["PADDLE_TRAINER_ID"])
        blamed = {0: 1, 1: 3}[rank]
        print(f"rank {rank}: lost rank {blamed}", flush=True)
        os.write(2, f"ringflow-exit-time {time.time() - 2 + rank} after-peer-failure {blamed}\\n"
                 .encode())
        time.sleep(0.5 * rank)  # rank 1 ends after rank 0
        sys.exit(1)
    """)
    done = launcher.run("--nproc-per-host", "2", "--log-dir", "logs", "worker.py", timeout=60)
    result = done.result
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[0]["ended_at"] < by_rank[1]["ended_at"], done.stdout
    assert [by_rank[r]["blamed_rank"] for r in (0, 1)] == [1, 3], done.stdout
    assert (result["status"], result["failed_rank"]) == ("failed", 1), done.stdout
    assert "rank 1: lost rank 3" in done.stdout


@pytest.mark.multiproc
def test_a_killed_rank_is_the_root_cause_before_the_peer_that_saw_it_die(launcher):
    """The killed rank reports nothing and its time is when the launcher saw its exit, which
    can be later than the report of a peer that noticed the death; the peer's report says it
    saw a peer fail first, so it is never taken for the cause."""
    launcher.script("worker.py", """
        import os, signal
        import numpy as np
        import ringflow.distributed as dist
        dist.init_parallel_env()
        rank = dist.get_rank()
        for i in range(1000000):
            dist.all_reduce(np.ones(1024))
            if rank == 1 and i == 20:
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = launcher.run("--nproc-per-host", "2", "worker.py", timeout=60)
    result = done.result
    assert (result["status"], result["failed_rank"], result["exit_code"]) == \
        ("failed", 1, 137), done.stdout
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert (by_rank[1]["signal"], by_rank[1]["after_peer_failure"]) == ("SIGKILL", False)
    assert by_rank[0]["exit_code"] != 0 and by_rank[0]["after_peer_failure"] is True, \
        done.stdout
