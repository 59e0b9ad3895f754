"""The provider follows Airflow's conventions: `default_args` reach the operators as they
reach any operator (real DAG objects, no tasks run); the provider, its example DAGs and
scripts import only Airflow's public modules; tasks fail with the provider's exception
classes (the failures that need a running job are in the operators' test modules)."""

from __future__ import annotations

import ast
import json
import socket
from pathlib import Path

import pytest
from airflow.sdk import DAG, TaskGroup
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.errors import FolderError, HostUnreachableError, LaunchError, gathered
from ringflow_provider import exceptions as rx
from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowHostUnreachableException,
    RingflowLaunchException,
)
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


def test_every_failure_class_is_an_airflow_exception_and_only_hopeless_ones_skip_retries():
    classes = {name: cls for name, cls in vars(rx).items()
               if isinstance(cls, type) and issubclass(cls, rx.RingflowException)}
    assert sorted(classes) == [
        "RingflowConfigException", "RingflowException", "RingflowFolderException",
        "RingflowHostNotAllowedException",
        "RingflowHostUnreachableException", "RingflowJobFailedException",
        "RingflowJobKilledException", "RingflowJobRefusedException", "RingflowLaunchException",
        "RingflowMetricGateException"]
    assert all(issubclass(cls, AirflowException) for cls in classes.values())
    no_retry = sorted(n for n, cls in classes.items() if issubclass(cls, AirflowFailException))
    assert no_retry == ["RingflowConfigException", "RingflowFolderException",
                        "RingflowHostNotAllowedException", "RingflowJobRefusedException",
                        "RingflowMetricGateException"]
    failed = rx.RingflowJobRefusedException("loss nan", 3, "n1")
    assert (str(failed), failed.exit_code, failed.host) == ("loss nan", 3, "n1")
    assert isinstance(failed, rx.RingflowJobFailedException)


def test_hosts_errors_gather_as_unreachable_only_when_every_host_was():
    lost = [HostUnreachableError("a: refused"), HostUnreachableError("b: refused")]
    mixed = [HostUnreachableError("a: refused"), LaunchError("b: no numpy")]
    assert (type(gathered("shipping", lost)), str(gathered("shipping", lost))) == (
        HostUnreachableError, "shipping failed: a: refused; b: refused")
    assert type(gathered("shipping", mixed)) is LaunchError
    assert type(rx.launch_exception(mixed[1], "m")) is RingflowLaunchException
    assert type(rx.launch_exception(lost[0], "m")) is RingflowHostUnreachableException


def test_folder_errors_gather_as_one_not_retried_only_when_every_host_had_one():
    bad = [FolderError("a: log_dir x is not writable"), FolderError("b: log_dir x ...")]
    assert type(gathered("checking", bad)) is FolderError
    assert type(gathered("checking", [bad[0], LaunchError("b: timeout")])) is LaunchError
    assert type(rx.launch_exception(gathered("checking", bad), "m")) is \
        rx.RingflowFolderException


@pytest.fixture
def closed_port_conn(monkeypatch) -> str:
    """An ssh connection to a port of this host where nothing listens: connects are refused
    at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_TEST_CLOSED", json.dumps(
        {"conn_type": "ssh", "host": "127.0.0.1", "port": port, "login": "nobody",
         "extra": {"no_host_key_check": "true", "look_for_keys": "false"}}))
    return "ringflow_test_closed"


REFUSED = r"cannot open SSH to host '127\.0\.0\.1' .*NoValidConnectionsError"


def unreachable_context(task_id: str) -> dict:
    from tests.provider.contexts import TaskInstanceStub

    return {"ti": TaskInstanceStub("conv", task_id)}


def test_tp_train_on_a_host_that_refuses_ssh_fails_as_unreachable(closed_port_conn, tmp_path):
    op = TPTrainOperator(task_id="train", model="mlp", steps=2, hosts=["127.0.0.1"],
                         ssh_conn_id=closed_port_conn, log_dir=str(tmp_path / "logs"))
    with pytest.raises(RingflowHostUnreachableException, match=REFUSED) as err:
        op.execute(unreachable_context("train"))
    assert not isinstance(err.value, AirflowFailException)    # a retry may find it back


def test_poprun_on_a_launch_host_that_refuses_ssh_fails_as_unreachable(closed_port_conn):
    op = PopRunOperator(task_id="poprun", ssh_conn_id=closed_port_conn, preflight=False,
                        conn_timeout=5, **{**POPRUN_ARGS, "hosts": "127.0.0.1", "num_ipus": 1})
    with pytest.raises(RingflowHostUnreachableException, match=REFUSED):
        op.execute(unreachable_context("poprun"))


@pytest.mark.parametrize(("operator", "args"), [
    pytest.param(TPTrainOperator, {"steps": 0}, id="tp_train"),
    pytest.param(PopRunOperator, {**POPRUN_ARGS, "num_ipus": "{{ params.n }}"}, id="poprun")])
def test_a_refused_argument_fails_as_config_without_retry(operator, args):
    op = operator(task_id="t", **args)
    op.render_template_fields({"params": {"n": "three"}})
    with pytest.raises(RingflowConfigException) as err:
        op.execute(unreachable_context("t"))
    assert isinstance(err.value, AirflowFailException)


def test_a_bad_literal_fails_as_config_when_the_dag_is_parsed():
    with pytest.raises(RingflowConfigException, match="task 'p': "):
        PopRunOperator(task_id="p", **{**POPRUN_ARGS, "num_ipus": 3})


def test_dependencies_cap_no_version_below_the_next_major():
    """A user may upgrade Airflow within 3.x: only a next major (`<4`) may cap it."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = {r.name: r for r in map(Requirement, project["dependencies"])}
    airflow = requirements["apache-airflow"].specifier
    assert [v in airflow for v in ("3.2.4", "3.3.0", "3.3.2", "3.4.0", "3.9.1", "4.0.0")] == [
        False, True, True, True, True, False]
    caps = {name: str(spec) for name, r in requirements.items() for spec in r.specifier
            if spec.operator in ("<", "<=", "~=", "==", "===")
            and not (spec.operator == "<" and Version(spec.version).release[1:] in
                     ((), (0,), (0, 0)))}
    assert caps == {}


def test_the_demo_summary_reads_no_metadata_database():
    """`make demo`'s summary goes through the public REST API, not Airflow's ORM."""
    source = (REPO / "scripts" / "demo_summary.py").read_text()
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    assert sorted(m for m in modules if m.split(".")[0] in ("airflow", "sqlalchemy")) == []
    assert "/api/v2" in source
