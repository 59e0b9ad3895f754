"""The example DAG's trigger form and TPTrainOperator agree on what each param may be: its
schema is generated from the operator's rules (ringflow_provider.tp_train.form), so every
value below is taken by both or refused by both (no job runs: the operator's validation
is called as `execute` calls it)."""

from __future__ import annotations

import copy

import pytest
from airflow.sdk.exceptions import ParamValidationError

from ringflow_provider.exceptions import RingflowConfigException
from ringflow_provider.tp_train.form import param_schemas
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


def form_takes(dag, name, value) -> bool:
    try:
        copy.deepcopy(dag.params.get_param(name)).resolve(value=value)  # resolve keeps it
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
