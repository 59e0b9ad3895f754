"""The worker environment contract of DESIGN.md section 3, as real workers see it."""

from __future__ import annotations

import pytest

from ringflow.launch.env import cores_available

pytestmark = pytest.mark.timeout(60)

DUMP_ENV = """
    import json, os
    rank = os.environ["PADDLE_TRAINER_ID"]
    keys = [k for k in os.environ if k.startswith(("PADDLE_", "RINGFLOW_"))
            or k.endswith("_NUM_THREADS")]
    with open(f"env.{rank}.json", "w") as f:
        f.write(json.dumps({k: os.environ[k] for k in keys}) + "\\n")
    print("dumped", rank)
"""


def dumped_envs(launcher, n: int) -> list[dict]:
    return [launcher.read_json(f"env.{r}.json") for r in range(n)]


@pytest.mark.multiproc
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_each_rank_gets_the_paddle_contract(launcher, n):
    launcher.script("dump.py", DUMP_ENV)
    done = launcher.run("--nproc-per-host", str(n), "dump.py")
    assert done.returncode == 0, done.stdout + done.stderr
    envs = dumped_envs(launcher, n)
    endpoints = envs[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert len(endpoints) == n and len(set(endpoints)) == n
    threads = str(max(1, cores_available() // n))
    for rank, env in enumerate(envs):
        assert env["PADDLE_TRAINER_ID"] == env["PADDLE_GLOBAL_RANK"] == str(rank)
        assert env["PADDLE_RANK_IN_NODE"] == env["PADDLE_LOCAL_RANK"] == str(rank)
        assert env["PADDLE_TRAINERS_NUM"] == env["PADDLE_GLOBAL_SIZE"] == str(n)
        assert env["PADDLE_LOCAL_SIZE"] == str(n)
        assert env["PADDLE_NNODES"] == "1"
        assert env["PADDLE_TRAINING_ROLE"] == "TRAINER"
        assert env["PADDLE_TRAINER_ENDPOINTS"].split(",") == endpoints
        assert env["PADDLE_CURRENT_ENDPOINT"] == endpoints[rank]
        assert endpoints[rank].startswith("127.0.0.1:")
        assert env["RINGFLOW_JOB_ID"] == launcher.job_id
        assert env["RINGFLOW_JOB_TOKEN"] == launcher.token
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            assert env[var] == threads
    assert sorted(done.lines("[rank ")) == sorted(f"{r}] dumped {r}" for r in range(n))
    assert done.result["exit_code"] == 0 and done.result["job_id"] == launcher.job_id


@pytest.mark.multiproc
def test_second_host_agent_gives_host_major_ranks_and_base_port_endpoints(launcher):
    launcher.script("dump.py", DUMP_ENV)
    done = launcher.run("--nproc-per-host", "2", "--hosts", "127.0.0.2,127.0.0.1",
                        "--host-index", "1", "--base-port", "6170", "dump.py")
    assert done.returncode == 0, done.stdout + done.stderr
    envs = [launcher.read_json(f"env.{r}.json") for r in (2, 3)]
    expected = "127.0.0.2:6170,127.0.0.2:6171,127.0.0.1:6170,127.0.0.1:6171"
    for local, env in enumerate(envs):
        assert env["PADDLE_TRAINER_ID"] == str(2 + local)
        assert env["PADDLE_RANK_IN_NODE"] == str(local)
        assert env["PADDLE_TRAINERS_NUM"] == "4" and env["PADDLE_NNODES"] == "2"
        assert env["PADDLE_TRAINER_ENDPOINTS"] == expected
        assert env["PADDLE_CURRENT_ENDPOINT"] == f"127.0.0.1:{6170 + local}"
    assert (launcher.dir / "log" / "workerlog.3").read_text() == "dumped 3\n"
    assert not (launcher.dir / "log" / "workerlog.0").exists()


@pytest.mark.multiproc
def test_job_id_and_token_are_made_when_not_in_the_environment_and_preset_threads_kept(
        launcher):
    launcher.script("dump.py", DUMP_ENV)
    env = launcher.env(identity=False, OMP_NUM_THREADS="3")
    done = launcher.run("--nproc-per-host", "2", "dump.py", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = dumped_envs(launcher, 2)
    assert first["RINGFLOW_JOB_ID"] == second["RINGFLOW_JOB_ID"] == done.result["job_id"]
    assert first["RINGFLOW_JOB_TOKEN"] == second["RINGFLOW_JOB_TOKEN"]
    assert len(first["RINGFLOW_JOB_TOKEN"]) == 64
    assert first["OMP_NUM_THREADS"] == second["OMP_NUM_THREADS"] == "3"
    assert first["RINGFLOW_JOB_TOKEN"] not in done.stdout + done.stderr


@pytest.mark.multiproc
def test_the_launchers_environment_reaches_workers_byte_for_byte(launcher):
    weird = 'a b "c" \'d\' $HOME `x` ; = \\n\nsecond line\tend'
    launcher.script("echo.py", """
        import os
        with open(f"weird.{os.environ['PADDLE_TRAINER_ID']}", "w") as f:
            f.write(os.environ["WEIRD"])
    """)
    done = launcher.run("--nproc-per-host", "2", "echo.py", env=launcher.env(WEIRD=weird))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(launcher.dir / f"weird.{r}").read_text() for r in (0, 1)] == [weird, weird]


@pytest.mark.multiproc
def test_job_token_is_never_printed_nor_logged_nor_on_a_command_line(launcher):
    launcher.script("worker.py", """
        import os, sys, time
        cmdlines = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdlines.append(f.read())
            except OSError:
                pass
        token = os.environ["RINGFLOW_JOB_TOKEN"].encode()
        print("token on a command line:", any(token in c for c in cmdlines))
        print("rank", os.environ["PADDLE_TRAINER_ID"], "fails", file=sys.stderr)
        sys.exit(int(os.environ["PADDLE_TRAINER_ID"]) + 4)
    """)
    done = launcher.run("--nproc-per-host", "2", "worker.py")
    assert done.returncode in (4, 5)
    assert done.lines("[rank 0] ")[0] == "token on a command line: False"
    logs = b"".join(p.read_bytes() for p in (launcher.dir / "log").iterdir())
    assert b"fails" in logs
    assert launcher.token not in done.stdout + done.stderr
    assert launcher.token.encode() not in logs


@pytest.mark.multiproc
def test_module_form_runs_the_module_with_its_arguments(launcher):
    pkg = launcher.dir / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import os, sys\n"
                                "print(os.environ['PADDLE_TRAINER_ID'], sys.argv[1:])\n")
    done = launcher.run("--nproc-per-host", "2", "-m", "mypkg.job", "--epochs", "3",
                        env=launcher.env(PYTHONPATH=str(launcher.dir)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(done.lines("[rank ")) == ["0] 0 ['--epochs', '3']", "1] 1 ['--epochs', '3']"]
    assert done.result["status"] == "succeeded"
