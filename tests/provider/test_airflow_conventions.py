"""The provider follows Airflow's conventions: `default_args` reach the operators as they
reach any operator (real DAG objects, no tasks run); the provider, its example DAGs and
scripts import only Airflow's public modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from airflow.sdk import DAG, TaskGroup

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator

REPO = Path(__file__).resolve().parents[2]
# what users install or copy: the provider, the example DAGs, the scripts `make demo` runs
PUBLIC_ONLY = ("provider/ringflow_provider", "dags", "scripts")

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


def private_airflow_imports(source: str) -> list[str]:
    """Every import of `source` that reaches into a private part of Airflow: a module path
    with a part starting with "_" (``airflow.sdk._shared...``), or a private name imported
    from an Airflow module. Imports inside functions count too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in names:
            parts = module.split(".")
            if parts[0] == "airflow" and (any(p.startswith("_") for p in parts)
                                          or name.startswith("_")):
                found.append((node.lineno, f"{module}{' ' + name if name else ''}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_import_check_finds_private_modules_and_names():
    source = ("import airflow.sdk\nfrom airflow.sdk import DAG\n"
              "def f():\n    from airflow.sdk._shared.secrets_masker import redact\n"
              "import airflow._shared.x\nfrom airflow.sdk.execution_time.task_runner import "
              "_serialize_rendered_fields\nfrom ._private import y\n")
    assert private_airflow_imports(source) == [
        "line 4: airflow.sdk._shared.secrets_masker redact", "line 5: airflow._shared.x",
        "line 6: airflow.sdk.execution_time.task_runner _serialize_rendered_fields"]


def test_provider_dags_and_scripts_import_no_private_airflow_module():
    files = sorted(f for folder in PUBLIC_ONLY for f in (REPO / folder).rglob("*.py"))
    assert len(files) > 20
    found = {str(f.relative_to(REPO)): private_airflow_imports(f.read_text()) for f in files}
    assert {name: hits for name, hits in found.items() if hits} == {}
