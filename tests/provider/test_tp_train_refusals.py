"""TPTrainOperator refuses what cannot run before any rank starts: misspelt arguments (with
the nearest name), a model builder that does not exist or builds no model, a job that does
not fit in a host's memory; and the local ranks get a minimal environment."""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path

import pytest

from ringflow.train import memory
from ringflow_provider.exceptions import RingflowConfigException
from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator
from ringflow_provider.tp_train.spec import parse_spec
from tests.provider.conftest import wait_until
from tests.provider.test_poprun_operator import RecordingLog
from tests.provider.test_tp_train_operator import ctx, log_text, marked
from tests.provider.test_tp_train_operator import make as make_fixture  # noqa: F401


@pytest.fixture
def make(make_fixture):  # noqa: F811  (the operator tests' factory, under its name here)
    return make_fixture


def test_a_misspelt_operator_argument_is_refused_naming_the_nearest_one():
    with pytest.raises(TypeError) as err:
        TPTrainOperator(task_id="train", stpes=3, retires=2)
    assert str(err.value) == (
        "Invalid arguments were passed to TPTrainOperator (task_id: train): 'stpes' (did you "
        "mean 'steps'?), 'retires' (did you mean 'retries'?)")


def test_a_misspelt_poprun_argument_is_refused_naming_the_nearest_one():
    with pytest.raises(TypeError) as err:
        PopRunOperator(task_id="pop", hosts="h1", nproc_per_host=1, ipus_per_replica=1,
                       num_ipus=1, ipu_partition="p", vipu_server="v", training_script="t.py",
                       print_topolgy=False)
    assert str(err.value).endswith("'print_topolgy' (did you mean 'print_topology'?)")


def test_a_misspelt_field_of_the_rendered_spec_names_the_nearest_one():
    with pytest.raises(ValueError) as err:
        parse_spec({"stpes": 3})
    assert str(err.value) == ("stpes: Extra inputs are not permitted (did you mean 'steps'?) "
                              "(got 3)")


def test_local_ranks_get_a_minimal_environment_not_the_workers(make, tmp_path, monkeypatch):
    """The worker's Airflow settings and connections, and anything else of its own, stay
    behind; the ranks get the basics, ringflow's variables and the job's own."""
    for name, value in {"AIRFLOW_CONN_X": "postgres://u:pw@db/x", "SOME_TOOL_HOME": "/opt",
                        "AIRFLOW__CORE__FERNET_KEY": "fernet-" + "k" * 20,
                        "LC_TIME": "C", "TMPDIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    op = make(model="tests.provider.tp_builders:build", steps=2,
              model_args={"environ_to": str(tmp_path / "environ")},
              secret_env={"WANDB_KEY": "s3cr3t-value"})
    op.extra_env["MY_SETTING"] = "1"
    op.execute(ctx())
    for rank in (0, 1):
        raw = (tmp_path / f"environ.{rank}").read_bytes().split(b"\0")
        env = dict(e.decode().split("=", 1) for e in raw if e)
        assert not [n for n in env if n.startswith("AIRFLOW") or n == "SOME_TOOL_HOME"]
        basics = {"PATH", "HOME", "LC_TIME", "TMPDIR"} | ({"LANG"} & set(os.environ))
        job = {"PYTHONPATH", "MY_SETTING", "TP_TEST_MARK", "WANDB_KEY"}
        ringflow_sets = {"PYTHONUNBUFFERED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                         "MKL_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT"}
        shell = {"PWD", "OLDPWD"}   # the start script's `cd` (to the login's home) sets them
        assert {n for n in env if not n.startswith(("PADDLE_", "RINGFLOW_"))} == (
            basics | job | ringflow_sets | shell)
        assert (env["PADDLE_TRAINER_ID"], env["WANDB_KEY"], env["TMPDIR"]) == (
            str(rank), "s3cr3t-value", str(tmp_path))
        assert env["TP_TEST_MARK"] == op.mark


@pytest.mark.parametrize("model, says", [
    ("tests.provider.no_such_module:build",
     "model tests.provider.no_such_module:build: cannot import tests.provider.no_such_module: "
     "No module named 'tests.provider.no_such_module'"),
    ("tests.provider.tp_builders:no_such_fn",
     "model tests.provider.tp_builders:no_such_fn: tests.provider.tp_builders has no function "
     "'no_such_fn'"),
    ("tests.provider.tp_builders:not_a_model",
     "model tests.provider.tp_builders:not_a_model returned dict, not a "
     "ringflow.models.BuiltModel (loss, feeds, make_batch)"),
])
def test_a_model_builder_that_is_missing_or_builds_no_model_fails_before_anything_starts(
        make, model, says):
    op = make(model=model)
    with pytest.raises(RingflowConfigException) as err:
        op.execute(ctx())
    assert str(err.value) == f"task 'train': {says}"
    assert not Path(op.log_dir).exists()          # no spec written, no agent started
    assert marked(op.mark) == []


def test_a_job_too_big_for_this_host_is_refused_naming_estimate_parts_and_memavailable(make):
    op = make(model_args={"input_size": 65536, "hidden_size": 65536, "num_classes": 4})
    with pytest.raises(RingflowConfigException) as err:
        op.execute(ctx())
    message = str(err.value)
    # mp 2: each rank holds half of fc1 (65536 x 32768 float32: 8 GiB) and of fc2
    assert re.search(r"the job does not fit in memory: 2 rank\(s\) per host need [\d.]+ MiB, "
                     r"[\d.]+ MiB per rank \(parameters 819[2-3]\.\d, gradients 819[2-3]\.\d, "
                     r"optimizer state 16385\.\d, activations [\d.]+, first-step flat copies "
                     r"3277\d\.\d, interpreter 40\.0 MiB\); "
                     rf"host {re.escape(socket.gethostname())} has MemAvailable \d+\.\d MiB "
                     r"\(/proc/meminfo\)", message), message
    assert not Path(op.log_dir).exists() and marked(op.mark) == []


def test_memory_check_false_starts_a_job_the_estimate_refuses(make):
    """`phantom` adds 1 TiB the estimate counts and the ranks never allocate."""
    args = dict(model="tests.provider.tp_builders:phantom", checkpoint_dir=None, steps=2,
                model_args={"phantom_mib": 1 << 20})
    with pytest.raises(RingflowConfigException, match="does not fit in memory"):
        make(**args).execute(ctx(run_id="refused"))
    op = make(memory_check="False", **args)
    summary = op.execute(ctx(run_id="unchecked"))
    assert summary["steps"] == 2
    assert re.search(r"memory: [\d.]+ MiB per rank \(.*optimizer state 104857\d\.\d.*\); not "
                     r"checked \(memory_check is False\)", log_text(op))


@pytest.mark.ssh
def test_on_hosts_the_preflight_reads_each_hosts_memavailable_over_ssh_and_refuses(
        ns_hosts, ns_conns):
    """Two namespace hosts (their own sshd, one kernel: the same MemAvailable): each host is
    named with the MemAvailable its /proc/meminfo gave over SSH, before any agent starts."""
    hosts = [h.address for h in list(ns_hosts)[:2]]
    run = f"hosts-{uuid.uuid4().hex[:8]}"
    op = TPTrainOperator(task_id="train", hosts=hosts, ssh_conn_id=dict(zip(hosts, ns_conns)),
                         python="/usr/bin/python3", model="mlp", nproc_per_host=2,
                         tensor_parallel_degree=2, model_args={
                             "input_size": 65536, "hidden_size": 65536, "num_classes": 4})
    op._cached_logger = RecordingLog()
    with pytest.raises(RingflowConfigException) as err:
        op.execute(ctx(run_id=run))
    named = re.findall(r"host (\S+) has MemAvailable (\d+)\.\d MiB", str(err.value))
    assert [h for h, _ in named] == hosts, str(err.value)
    here = memory.mem_available() / memory.MIB
    assert all(abs(int(mib) - here) < 512 for _, mib in named), (named, here)
    for host in list(ns_hosts)[:2]:   # (the SSH sessions' sshd processes end with them)
        wait_until(lambda host=host: not host.leftovers(), 20, f"{host.address}: sshd")
        # no job folder, no spec written: nothing of the job reached the host
        assert host.sh(f"find ~/.ringflow -path '*{run}*' 2>/dev/null").stdout == ""
