"""Property: whatever conf a run of an example DAG is triggered with (generated ones
per DAG: each param valid, hostile or of another type, unknown params), Airflow's param
validation refuses it naming the param, or the task, its templates rendered with it, is
refused by the operator naming the argument, or it sends its hosts only what its arguments
allow (the operators' own properties: test_properties_poprun.py,
test_properties_tp_train.py). A template that builds a JSON object around params (the TP
DAG's optimizer) keeps its keys whatever the conf holds.

Rendering is Airflow's (`render_template` with the DAG's Jinja environment, each template
compiled once); the hosts only record what they are sent.
"""

from __future__ import annotations

import copy
import functools
import json
import re

import pytest
from airflow.sdk.exceptions import ParamValidationError
from hypothesis import given
from hypothesis import strategies as st

from tests.hostile import PROPERTY_SETTINGS, anything, hostile_text, text_or
from tests.provider import test_properties_poprun as poprun_props
from tests.provider import test_properties_tp_train as tp_props
from tests.provider.conftest import REPO

pytestmark = pytest.mark.slow

# a template that hands one param on as it is (its text or its JSON)
_PASSED_ON = re.compile(r"^\{\{ *params\.\w+( *\| *tojson| or '')? *\}\}$")


@functools.cache
def example(dag_id: str):
    """The DAG's one task, a working copy of it (its template fields set anew for each
    example), its Jinja environment compiling each template once, and its params."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags[dag_id]
    task = dag.tasks[0]
    env = dag.get_template_env()
    env.from_string = functools.lru_cache(maxsize=None)(env.from_string)
    work = copy.deepcopy(task)
    work.preflight = False  # an SSH look at the hosts: the hosts' side
    return dag, task, work, env


@functools.cache
def conf_strategy(dag_id: str) -> st.SearchStrategy:
    dag = example(dag_id)[0]
    valid, hostile = {}, {}
    for name in dag.params:
        param = dag.params.get_param(name)
        default = param.value
        choices = param.schema.get("enum") or (
            [True, False] if param.schema.get("type") == "boolean" else [default])
        valid[name] = st.sampled_from(choices)
        hostile[name] = st.one_of(anything(), hostile_text(),
                                  text_or(str(default)) if isinstance(default, str)
                                  else st.integers(-3, 70_000))
    names = sorted(valid)

    @st.composite
    def confs(draw) -> dict:
        conf = {}
        for name in draw(st.sets(st.sampled_from(names), max_size=4)):
            conf[name] = draw(valid[name])
        for name in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
            conf[name] = draw(hostile[name])
        if draw(st.integers(0, 9)) == 0:
            conf[draw(text_or("unknown", "steps "))] = draw(anything())
        return conf

    return confs()


class _UnsetVariables:
    """The context's ``var.value`` / ``var.json`` of a deployment where the DAG's Variables
    are unset: ``get(name, default)`` gives the template's default. (Airflow's own accessor
    asks the API server, which a property example has none of; the Variables' values are
    the DAG author's choice, the params are what a trigger sends.)"""

    def get(self, name: str, default=None):
        return default

    def __getattr__(self, name: str):
        raise KeyError(f"Variable {name} does not exist")


VARIABLES = {"value": _UnsetVariables(), "json": _UnsetVariables()}


def render(dag_id: str, conf: dict):
    """(the task's working copy with its fields rendered, the rendered values), or None
    when Airflow's param validation refuses the conf (checked to name the param)."""
    dag, task, work, env = example(dag_id)
    # what triggering a run does with its conf (the serialized DAG's deep_merge, then
    # validate), param by param: the defaults are valid (render_defaults)
    params = dict(render_defaults(dag_id)["params"])
    for name, value in conf.items():
        if name not in dag.params:
            params[name] = value
            continue
        try:
            params[name] = copy.deepcopy(dag.params.get_param(name)).resolve(value=value)
        except ParamValidationError:  # Airflow refuses the run ("Invalid input for param")
            return None
    context = {"params": params, "var": VARIABLES}
    rendered = {name: task.render_template(getattr(task, name), context, env)
                for name in task.template_fields}
    for name, value in rendered.items():
        setattr(work, name, value)
    work._killed, work._handle = False, None
    return work, rendered, context


def check_templates_keep_their_keys(dag_id: str, rendered: dict) -> None:
    """A template that builds a JSON object around params keeps the object's keys."""
    task = example(dag_id)[1]
    defaults = render_defaults(dag_id)
    for name, template in ((n, getattr(task, n)) for n in task.template_fields):
        if not isinstance(template, str) or "{{" not in template or \
                _PASSED_ON.match(template.strip()):
            continue
        try:
            built = json.loads(rendered[name])
        except (TypeError, ValueError):
            continue  # not JSON: the operator refuses it, naming the argument
        if isinstance(built, dict):
            assert set(built) == set(json.loads(defaults[name])), (name, rendered[name])


@functools.cache
def render_defaults(dag_id: str) -> dict:
    """The fields rendered with the params' defaults (and those params, as "params")."""
    dag, task, _, env = example(dag_id)
    context = {"params": dag.params.validate(), "var": VARIABLES}
    return {**{name: task.render_template(getattr(task, name), context, env)
               for name in task.template_fields}, "params": context["params"]}


@pytest.fixture(scope="module")
def poprun_ids():
    example("ringflow_poprun")  # the DAG parsed before hypothesis runs
    with poprun_props.known_ids():
        yield


@pytest.fixture(scope="module")
def tp_ids(tmp_path_factory):
    example("ringflow_tp_train")
    with tp_props.known_ids(tmp_path_factory.mktemp("ringflow-home")):
        yield


@PROPERTY_SETTINGS
@given(data=st.data())
def test_a_poprun_run_conf_is_refused_by_name_or_adds_nothing(poprun_ids, data):
    conf = data.draw(conf_strategy("ringflow_poprun"), label="conf")
    done = render("ringflow_poprun", conf)
    if done is not None:
        work, rendered, _ = done
        check_templates_keep_their_keys("ringflow_poprun", rendered)
        poprun_props.check_operator(work, rendered)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_a_tp_train_run_conf_is_refused_by_name_or_adds_nothing(tp_ids, data):
    conf = data.draw(conf_strategy("ringflow_tp_train"), label="conf")
    done = render("ringflow_tp_train", conf)
    if done is not None:
        work, rendered, _ = done
        check_templates_keep_their_keys("ringflow_tp_train", rendered)
        tp_props.check_operator(work, rendered)

