"""LaunchConfig parsing and validation, endpoint planning and the job identity: pure
functions, plus the CLI's exit code 2 with a one-line message for bad input."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.launch.config import LaunchConfig, parse_launch_args
from ringflow.launch.env import plan_endpoints, resolve_identity, worker_env
from ringflow.launch.watchdog import Orders, read_until_done

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def parse(tmp_path, *argv: str) -> LaunchConfig:
    return parse_launch_args(list(argv), cwd=tmp_path)


def test_defaults_are_one_local_host_log_dir_log_and_free_ports(tmp_path, script):
    config = parse(tmp_path, "--nproc-per-host", "2", "train.py", "--lr", "0.1")
    assert config.hosts == ("127.0.0.1",)
    assert config.host_index == 0
    assert config.base_port is None
    assert str(config.log_dir) == "log"
    assert config.args == ("--lr", "0.1")
    assert config.command("py") == ["py", "-u", "train.py", "--lr", "0.1"]


def test_module_form_runs_python_dash_m(tmp_path):
    config = parse(tmp_path, "--nproc-per-host", "1", "-m", "pkg.train", "-x")
    assert config.module
    assert config.command("py") == ["py", "-u", "-m", "pkg.train", "-x"]


def test_multi_host_ranks_and_endpoints_are_host_major_from_the_base_port(tmp_path, script):
    config = parse(tmp_path, "--nproc-per-host", "2", "--hosts", "10.0.0.1,10.0.0.2,node3",
                   "--host-index", "1", "--base-port", "7000", "train.py")
    assert [config.global_rank(i) for i in range(2)] == [2, 3]
    assert config.world_size == 6
    assert plan_endpoints(config) == [
        "10.0.0.1:7000", "10.0.0.1:7001", "10.0.0.2:7000", "10.0.0.2:7001",
        "node3:7000", "node3:7001"]


def test_an_agent_started_by_mpirun_takes_its_host_index_from_its_mpi_rank(tmp_path, script):
    argv = ["--nproc-per-host", "2", "--hosts", "a,b,c", "--host-index-env",
            "OMPI_COMM_WORLD_RANK", "--base-port", "7000", "train.py"]
    config = parse_launch_args(argv, cwd=tmp_path, environ={"OMPI_COMM_WORLD_RANK": "2"})
    assert (config.host_index, config.host, config.global_rank(1)) == (2, "c", 5)


@pytest.mark.parametrize("environ, extra, message", [
    ({}, [], "OMPI_COMM_WORLD_RANK is not set (is this agent started by mpirun?)"),
    ({"OMPI_COMM_WORLD_RANK": "x"}, [], "OMPI_COMM_WORLD_RANK='x' is not a host index"),
    ({"OMPI_COMM_WORLD_RANK": "3"}, [], "--host-index must be in 0..2"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, ["--host-index", "0"], "not both"),
])
def test_a_host_index_env_that_gives_no_host_is_an_error(tmp_path, script, environ, extra,
                                                        message):
    argv = ["--nproc-per-host", "1", "--hosts", "a,b,c", "--host-index-env",
            "OMPI_COMM_WORLD_RANK", *extra, "--base-port", "7000", "train.py"]
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_launch_args(argv, cwd=tmp_path, environ=environ)


def test_free_ports_are_distinct_per_rank_on_the_single_host(tmp_path, script):
    config = parse(tmp_path, "--nproc-per-host", "4", "train.py")
    endpoints = plan_endpoints(config)
    assert len({e.rsplit(":", 1)[1] for e in endpoints}) == 4
    assert all(e.startswith("127.0.0.1:") for e in endpoints)


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-host", "0", "train.py"], "--nproc-per-host must be between 1 and"),
    (["--nproc-per-host", "-3", "train.py"], "got -3"),
    (["--nproc-per-host", "two", "train.py"], "invalid int value: 'two'"),
    (["--nproc-per-host", "2", "missing.py"], "script 'missing.py' does not exist"),
    (["--nproc-per-host", "2", "-m", "not a module"], "dotted module name"),
    (["--nproc-per-host", "2", "--hosts", "a,,b", "--host-index", "0", "--base-port", "9",
      "train.py"], "empty entry"),
    (["--nproc-per-host", "2", "--hosts", "a,a", "--host-index", "0", "--base-port", "9",
      "train.py"], "names a more than once"),
    (["--nproc-per-host", "2", "--hosts", "bad_host!", "train.py"],
     "--hosts: host 'bad_host!' is not a hostname or IPv4 address"),
    (["--nproc-per-host", "2", "--hosts", "10.0.0", "train.py"],
     "--hosts: host '10.0.0' is neither an IPv4 address (four numbers) nor a hostname"),
    (["--nproc-per-host", "2", "--hosts", "a,b", "--base-port", "9000", "train.py"],
     "--host-index is required with 2 hosts"),
    (["--nproc-per-host", "2", "--hosts", "a,b", "--host-index", "2", "--base-port", "9000",
      "train.py"], "--host-index must be in 0..1"),
    (["--nproc-per-host", "2", "--hosts", "a,b", "--host-index", "0", "train.py"],
     "--base-port is required with 2 hosts"),
    (["--nproc-per-host", "2", "--host-index", "1", "train.py"], "--host-index needs --hosts"),
    (["--nproc-per-host", "4", "--base-port", "65534", "train.py"], "must lie in 1..65535"),
    (["--nproc-per-host", "2"], "required: script.py|module"),
    (["train.py"], "required: --nproc-per-host"),
])
def test_bad_arguments_raise_config_error_naming_the_problem(tmp_path, script, argv, message):
    with pytest.raises(ConfigError, match=None) as info:
        parse(tmp_path, *argv)
    assert message in str(info.value)


def test_log_dir_under_a_file_is_rejected(tmp_path, script):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="afile is not a directory"):
        parse(tmp_path, "--nproc-per-host", "1", "--log-dir", "afile/logs", "train.py")


def test_identity_from_the_environment_when_both_are_set():
    identity, warning = resolve_identity({"RINGFLOW_JOB_ID": "job_7", "RINGFLOW_JOB_TOKEN": "s"})
    assert (identity.job_id, identity.token, warning) == ("job_7", "s", None)
    assert "s" not in repr(identity).replace("job_7", "")


def test_identity_is_made_fresh_when_absent_and_differs_per_call():
    a, _ = resolve_identity({})
    b, _ = resolve_identity({})
    assert a.job_id != b.job_id and a.token != b.token
    assert len(a.token) == 64 and "-" not in a.job_id


def test_half_an_identity_is_replaced_with_a_warning_that_omits_the_token():
    identity, warning = resolve_identity({"RINGFLOW_JOB_TOKEN": "secret-value"})
    assert identity.token != "secret-value"
    assert "RINGFLOW_JOB_ID is not" in warning and "secret-value" not in warning


def test_a_job_id_that_could_collide_in_shm_names_is_rejected():
    with pytest.raises(ConfigError, match="RINGFLOW_JOB_ID='a-b'"):
        resolve_identity({"RINGFLOW_JOB_ID": "a-b", "RINGFLOW_JOB_TOKEN": "t"})


def test_thread_counts_are_set_only_where_unset(tmp_path, script):
    config = parse(tmp_path, "--nproc-per-host", "2", "--base-port", "7000", "train.py")
    identity, _ = resolve_identity({})
    env = worker_env(config, identity, plan_endpoints(config), 1, {"MKL_NUM_THREADS": "7"})
    assert env["MKL_NUM_THREADS"] == "7"
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"]
    # the update runs on the rank's BLAS threads; OpenBLAS's idle workers sleep soon
    assert env["RINGFLOW_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"]
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "18"


@pytest.mark.parametrize("base, threads, timeout", [
    ({"OPENBLAS_NUM_THREADS": "3"}, "3", "18"),
    ({"OPENBLAS_NUM_THREADS": "3", "RINGFLOW_NUM_THREADS": "1"}, "1", "18"),
    ({"OPENBLAS_THREAD_TIMEOUT": "28", "RINGFLOW_NUM_THREADS": ""}, None, "28"),
])
def test_update_threads_and_the_blas_timeout_follow_what_is_set(tmp_path, script, base,
                                                                 threads, timeout):
    config = parse(tmp_path, "--nproc-per-host", "2", "--base-port", "7000", "train.py")
    identity, _ = resolve_identity({})
    env = worker_env(config, identity, plan_endpoints(config), 1, base)
    assert env["RINGFLOW_NUM_THREADS"] == (threads or env["OPENBLAS_NUM_THREADS"])
    assert env["OPENBLAS_THREAD_TIMEOUT"] == timeout


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-host", "0", "train.py"], "--nproc-per-host must be between 1 and 1024"),
    (["--nproc-per-host", "1", "nope.py"], "script 'nope.py' does not exist"),
    (["--nproc-per-host", "1", "--hosts", "x y", "train.py"], "is not a hostname or IPv4 address"),
])
def test_cli_reports_bad_config_in_one_line_with_exit_code_2(launcher, script, argv, message):
    done = launcher.run(*argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("python -m ringflow.launch: error: ")
    assert message in done.stderr


def test_console_script_has_a_launch_subcommand_with_the_same_options(launcher, script):
    installed = Path(sys.executable).with_name("ringflow")
    ringflow = [str(installed)] if installed.exists() else [
        sys.executable, "-c", "import sys; from ringflow.launch.cli import main; sys.exit(main())"]
    done = launcher.run("launch", "--nproc-per-host", "0", "train.py", command=ringflow)
    assert done.returncode == 2
    assert done.stderr.startswith("ringflow launch: error: --nproc-per-host must be")
    assert launcher.run("bogus", command=ringflow).returncode == 2


def test_watchdog_protocol_collects_groups_until_done_or_eof():
    assert read_until_done(io.BytesIO(b"pg 12\npg 13\ndone\npg 14\n")) == Orders([12, 13],
                                                                                  [], True)
    assert read_until_done(io.BytesIO(b"pg 12\nnoise\npg x\n")) == Orders([12], [], False)
    assert read_until_done(io.BytesIO(b"")) == Orders([], [], False)
