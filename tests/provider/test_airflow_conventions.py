"""The operators follow Airflow's conventions: `default_args` reach them as they reach any
operator, built on real DAG objects (no tasks run)."""

from __future__ import annotations

import pytest
from airflow.sdk import DAG, TaskGroup

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator

POPRUN_ARGS = {"hosts": "n1,n2", "nproc_per_host": 1, "ipus_per_replica": 1, "num_ipus": 2,
               "ipu_partition": "p", "vipu_server": "s", "training_script": "t.py"}
OPERATORS = [pytest.param(TPTrainOperator, {}, id="tp_train"),
             pytest.param(PopRunOperator, POPRUN_ARGS, id="poprun")]


@pytest.mark.parametrize(("operator", "args"), OPERATORS)
@pytest.mark.parametrize("retries", [5, 0])
def test_dag_default_args_retries_reach_the_operator(operator, args, retries):
    with DAG("conv_dag_default", schedule=None, default_args={"retries": retries}):
        task = operator(task_id="t", **args)
    assert task.retries == retries


@pytest.mark.parametrize(("operator", "args"), OPERATORS)
def test_task_retries_win_over_dag_default_args(operator, args):
    with DAG("conv_task_wins", schedule=None, default_args={"retries": 5}):
        task = operator(task_id="t", retries=3, **args)
    assert task.retries == 3


@pytest.mark.parametrize(("operator", "args"), OPERATORS)
def test_task_group_and_task_default_args_retries_reach_the_operator(operator, args):
    with DAG("conv_group", schedule=None, default_args={"retries": 5}):
        with TaskGroup("g", default_args={"retries": 4}):
            in_group = operator(task_id="in_group", **args)
        own = operator(task_id="own", default_args={"retries": 2}, **args)
    assert (in_group.retries, own.retries) == (4, 2)


@pytest.mark.parametrize(("operator", "args"), OPERATORS)
def test_retries_default_to_one_when_nobody_sets_them(operator, args):
    with DAG("conv_nobody", schedule=None, default_args={"owner": "ml"}):
        in_dag = operator(task_id="in_dag", **args)
    alone = operator(task_id="alone", **args)
    assert (in_dag.retries, in_dag.owner, alone.retries) == (1, "ml", 1)
