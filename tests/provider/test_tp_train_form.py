"""The example DAG's trigger form and TPTrainOperator agree on what each param may be: its
schema is generated from the operator's rules (ringflow_provider.tp_train.form), so every
value below is taken by both or refused by both (no job runs: the operator's validation
is called as `execute` calls it). What reaches the hosts (hosts, connection, interpreter)
the DAG narrows to what its author allows (`variable_choices`): Airflow refuses the rest."""

from __future__ import annotations

import copy
import json
import runpy

import pytest
from airflow.sdk import Param
from airflow.sdk.exceptions import ParamValidationError

from ringflow_provider.exceptions import RingflowConfigException
from ringflow_provider.tp_train.form import param_schemas, variable_choices
from tests.provider.conftest import REPO
from tests.provider.contexts import TaskInstanceStub

# (param, value, taken): values either side of each rule; those marked "was" the form
# before its schema was generated took or refused unlike the operator
CASES = [
    ("steps", 1, True), ("steps", 0, False), ("steps", 100_001, True),            # was
    ("global_batch_size", 70_000, True),                                          # was
    ("seed", -1, False), ("log_every", 0, False),
    ("nproc_per_host", 80, True), ("nproc_per_host", 0, False),                   # was
    ("tensor_parallel_degree", 0, False),
    ("learning_rate", 0.0, True), ("learning_rate", 50.0, True),                  # was
    ("learning_rate", -0.1, False),
    ("optimizer_type", "lamb", True), ("optimizer_type", "adagrad", False),
    ("optimizer_type", "lars", False),               # was: lars needs a momentum too
    ("model", "mlp", True), ("model", "gpt", False),
    ("sharding_stage", 2, True), ("sharding_stage", 3, False),
    ("hosts", None, True), ("hosts", "trainer-a, trainer-b", True),
    ("hosts", "10.0.0.1,10.0.0.2", True),
    ("hosts", "trainer_a", False), ("hosts", "trainer-a:22", False),              # was
    ("hosts", "1.2.3", False), ("hosts", "a,,b", False), ("hosts", "999.1.1.1", False),
    ("launcher", "mpirun", True), ("launcher", "slurm", False),
    ("ssh_conn_id", "ssh_hosts", True), ("ssh_conn_id", "   ", False),            # was
    ("python", "/opt/py/bin/python3", True), ("python", "-c", False),             # was
    ("poll_interval", 0.1, True), ("poll_interval", 0, False),                    # was
    ("on_existing", "restart", True), ("on_existing", "again", False),
]

# what else a case sets, so that no rule across fields refuses it
ALSO = {("nproc_per_host", 80): {"global_batch_size": 40},
        # the operator reads these only with hosts
        **{(name, value): {"hosts": "trainer-a"} for name, value, _ in CASES
           if name in ("launcher", "ssh_conn_id", "python")}}


@pytest.fixture(scope="module")
def example():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["ringflow_tp_train"]
    return dag, dag.get_task("train"), {k: dag.params[k] for k in dag.params}


#: params the example DAG narrows to its author's choices: the operator's own rules for them
#: are the generated schema's (test_the_example_form_offers_only_the_hosts_allowed: the DAG's)
AUTHOR_CHOICES = ("hosts", "ssh_conn_id", "python")


def form_takes(dag, name, value) -> bool:
    param = dag.params.get_param(name)
    if name in AUTHOR_CHOICES:
        param = Param(**param_schemas({name: {}})[name])
    try:
        copy.deepcopy(param).resolve(value=value)  # resolve keeps it
    except ParamValidationError:
        return False
    return True


def operator_takes(task, params, tmp_path) -> bool:
    op = copy.deepcopy(task)
    op.render_template_fields({"params": params})
    try:
        op._plan({"ti": TaskInstanceStub("ringflow_tp_train", "train")})
        op._job_options()
    except (RingflowConfigException, ValueError):
        return False
    return True


@pytest.mark.parametrize(("name", "value", "taken"), CASES,
                         ids=[f"{n}={v!r}" for n, v, _ in CASES])
def test_the_form_and_the_operator_take_and_refuse_the_same_values(example, name, value,
                                                                   taken, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("RINGFLOW_HOME", str(tmp_path))
    dag, task, defaults = example
    params = {**defaults, name: value,
              **ALSO.get((name, value), {})}
    assert (form_takes(dag, name, value), operator_takes(task, params, tmp_path)) == (
        taken, taken)


def test_a_host_given_twice_is_the_one_rule_the_form_cannot_say(example, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("RINGFLOW_HOME", str(tmp_path))
    dag, task, defaults = example
    params = {**defaults, "hosts": "a,a"}
    assert (form_takes(dag, "hosts", "a,a"), operator_takes(task, params, tmp_path)) == (
        True, False)


def test_the_defaults_are_taken_by_the_operator(example, tmp_path, monkeypatch):
    monkeypatch.setenv("RINGFLOW_HOME", str(tmp_path))
    _, task, defaults = example
    assert operator_takes(task, defaults, tmp_path)


@pytest.mark.parametrize(("fields", "message"), [
    ({"steps": {"maximum": 100_000}}, "maximum come from the operator's rules for 'steps'"),
    ({"hosts": {"pattern": ".*"}}, "pattern come from the operator's rules for 'hosts'"),
    ({"steps": {"type": "string"}}, "steps: type 'string' is wider"),
    ({"lr": {"field": "optimizer.learning_rate", "type": "string"}},
     "optimizer.learning_rate: type 'string' is wider"),
    ({"model": {"enum": ["mlp", "gpt"]}}, "model: the operator refuses 'gpt'"),
    ({"steps": {"default": 0}}, "steps: the operator refuses 0"),
    ({"lr": {}}, "'lr' is not an argument of TPTrainOperator"),
])
def test_a_dag_cannot_widen_or_contradict_the_operators_rules(fields, message):
    with pytest.raises(ValueError, match=message):
        param_schemas(fields)


def test_a_dag_may_narrow_a_choice_and_say_how_it_is_shown():
    schemas = param_schemas({
        "recompute": {"type": "boolean", "section": "Job", "default": True},
        "optimizer_type": {"field": "optimizer.type", "enum": ["adam", "sgd"]}})
    assert schemas["recompute"] == {"type": "boolean", "section": "Job", "default": True,
                                    "description": schemas["recompute"]["description"]}
    assert (schemas["optimizer_type"]["type"], schemas["optimizer_type"]["enum"]) == (
        "string", ["adam", "sgd"])


def example_dag(monkeypatch, **variables):
    """The example DAG as parsed with these Airflow Variables set (JSON text)."""
    for key, value in variables.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_{key.upper()}", json.dumps(value))
    # the module itself, run afresh (dags/ringflow_tp_train.py imports it once per process)
    return runpy.run_path(str(REPO / "provider/ringflow_provider/example_dags/ringflow_tp_train.py")
                          )["dag"]


def conf_refused(dag, **conf) -> str | None:
    """What Airflow's ParamsDict says of a run's `conf` (None: taken); a trigger over REST
    is tests/e2e/test_trigger.py."""
    params = copy.deepcopy(dag.params)
    try:
        params.update(conf)
        params.validate()
    except ParamValidationError as exc:
        return str(exc)
    return None


def test_the_example_form_offers_only_the_hosts_its_variable_allows(monkeypatch):
    dag = example_dag(monkeypatch, ringflow_tp_train_hosts=[
        "trainer-a,trainer-b", ["gpu-1", "gpu-2"]])

    assert dag.params.get_param("hosts").schema["enum"] == [None, "trainer-a,trainer-b",
                                                            "gpu-1,gpu-2"]
    assert conf_refused(dag, hosts="gpu-1,gpu-2") is None
    assert conf_refused(dag, hosts=None) is None
    for conf in ({"hosts": "evil.example"}, {"hosts": "trainer-a"},
                 {"ssh_conn_id": "ssh_attacker"}, {"python": "/tmp/evil"}):
        (name,) = conf
        assert f"Invalid input for param {name}: " in (conf_refused(dag, **conf) or ""), conf


def test_without_the_variable_the_form_offers_no_host_but_this_worker(monkeypatch):
    monkeypatch.delenv("AIRFLOW_VAR_RINGFLOW_TP_TRAIN_HOSTS", raising=False)
    dag = example_dag(monkeypatch)
    assert dag.params.get_param("hosts").schema["enum"] == [None]
    assert dag.params.get_param("ssh_conn_id").schema["enum"] == ["ssh_default"]
    assert "Invalid input for param hosts: " in conf_refused(dag, hosts="trainer-a")


@pytest.mark.parametrize(("value", "choices"), [
    (None, ["d"]),                                   # unset: the default
    (["a,b", ["c", " d"]], ["a,b", "c,d"]),           # a host list: comma text
    ([1, 2.5, True, None], [1, 2.5, True, None]),
])
def test_variable_choices_reads_a_json_list(monkeypatch, value, choices):
    key = "ringflow_test_choices"
    monkeypatch.delenv(f"AIRFLOW_VAR_{key.upper()}", raising=False)
    if value is not None:
        monkeypatch.setenv(f"AIRFLOW_VAR_{key.upper()}", json.dumps(value))
    assert variable_choices(key, ["d"]) == choices


@pytest.mark.parametrize("text", ['"a,b"', '{"a": 1}', "[[1, 2]]", "[{}]", "not json"])
def test_variable_choices_refuses_anything_but_a_list_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv("AIRFLOW_VAR_RINGFLOW_TEST_CHOICES", text)
    with pytest.raises(ValueError, match="Airflow Variable 'ringflow_test_choices'"):
        variable_choices("ringflow_test_choices")
