"""TPTrainOperator refuses what cannot run before any rank starts: misspelt arguments (with
the nearest name), a model builder that does not exist or builds no model, a job that does
not fit in a host's memory; and the local ranks get a minimal environment."""

from __future__ import annotations

import os

import pytest

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator
from ringflow_provider.tp_train.spec import parse_spec
from tests.provider.test_tp_train_operator import ctx, make  # noqa: F401  (make: the fixture)


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
