"""Triggering the example DAGs the way users do, against real Airflow services (api-server,
scheduler with the LocalExecutor, dag-processor; SQLite): over REST with the body the UI
sends, and once through the trigger form in Chromium.

DAG_CASES is the table of DAGs and what a trigger must do; a new example DAG is one entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.airflow, pytest.mark.slow]

UI_SECTION_DEFAULT = "Run Parameters"  # the form's section for params that name none


@dataclass(frozen=True)
class DagCase:
    """One example DAG triggered with a conf.

    `conf` holds the params a user changes in the trigger form; the others keep their
    defaults (the UI sends them all, and so do these tests). `expected` holds keys of the
    task's return value (its XCom) and their values, or a predicate over the value.
    Each of `invalid_confs` breaks one param's schema (a bound, or a choice the DAG author
    does not allow: a host, a connection); the API must refuse it with 400, naming it.
    """

    dag_id: str
    task_id: str
    conf: dict[str, Any]
    expected: dict[str, Any]
    invalid_confs: tuple[dict[str, Any], ...]
    run_timeout_s: float = 90.0

    def __str__(self) -> str:
        return self.dag_id


DAG_CASES = [
    # dry_run keeps its default (True): PopRunOperator.execute validates the params, renders
    # the PopRun command and returns its summary, with no SSH and no IPU.
    DagCase("ringflow_poprun", "poprun",
            conf={"hosts": "n1,n2", "num_ipus": 8, "extra_env": {"RUN_TOKEN": "tok-e2e-4410"}},
            expected={"num_instances": 4, "num_replicas": 8, "launch_host": "n1",
                      "dry_run": True, "exit_code": None,
                      "argv": lambda argv: "--host=n1,n2" in argv
                      and any(arg.endswith(" -x RUN_TOKEN") for arg in argv)  # bare
                      and not any("tok-e2e-4410" in arg for arg in argv)},
            invalid_confs=({"num_ipus": 0}, {"hosts": "evil.example"},
                           {"launch_host": "evil.example"})),
    # The main job: the transformer, mp 2 x dp 1 on 2 local ranks, fewer steps.
    DagCase("ringflow_tp_train", "train",
            conf={"steps": 20, "log_every": 5, "seed": 3},
            expected={"steps": 20, "world_size": 2, "mp_degree": 2, "dp_degree": 1,
                      "resumed_from": None,
                      "loss_history": lambda h: [s for s, _ in h] == [1, 5, 10, 15, 20]
                      and h[-1][1] < h[0][1],
                      "final_loss": lambda v: isinstance(v, float) and math.isfinite(v)},
            invalid_confs=({"steps": 0}, {"hosts": "evil.example"},
                           {"ssh_conn_id": "ssh_attacker"}, {"python": "/tmp/evil"}),
            run_timeout_s=180),
]


@dataclass(frozen=True)
class FormCase:
    """A param changed in the UI's trigger form: what the user types and what the run's conf
    must then hold."""

    dag_id: str
    param: str
    typed: str
    expected: Any
    run_timeout_s: float = 90.0


FORM_CASES = [FormCase("ringflow_poprun", "num_ipus", "8", 8),
              FormCase("ringflow_tp_train", "steps", "15", 15, run_timeout_s=180)]


def _mismatches(actual: dict, expected: dict) -> dict:
    wrong = {}
    for key, want in expected.items():
        value = actual.get(key, "<missing>")
        ok = want(value) if callable(want) else value == want
        if not ok:
            wrong[key] = value
    return wrong


@pytest.mark.parametrize("case", DAG_CASES, ids=str)
def test_rest_trigger_with_the_forms_conf_runs_the_task_with_it(airflow_services, case):
    api = airflow_services.api
    api.unpause(case.dag_id)
    conf = api.form_conf(case.dag_id, **case.conf)

    response = api.trigger(case.dag_id, conf)

    assert response.status_code == 200, response.text
    created = response.json()
    assert created["conf"] == conf
    assert created["logical_date"] is None
    run = api.wait_for_run(case.dag_id, created["dag_run_id"], case.run_timeout_s)
    result = api.xcom(case.dag_id, run["dag_run_id"], case.task_id)
    assert _mismatches(result, case.expected) == {}, result


@pytest.mark.parametrize("case", DAG_CASES, ids=str)
def test_rest_trigger_with_a_conf_the_params_refuse_is_400_and_creates_no_run(
        airflow_services, case):
    api = airflow_services.api
    api.unpause(case.dag_id)
    before = api.run_ids(case.dag_id)
    refused = {}
    for invalid in case.invalid_confs:
        (param,) = invalid
        response = api.trigger(case.dag_id, api.form_conf(case.dag_id, **invalid))
        refused[param] = (response.status_code, f"Invalid input for param {param}:"
                          in response.json().get("detail", ""))

    assert refused == {param: (400, True) for conf in case.invalid_confs for param in conf}
    assert api.run_ids(case.dag_id) == before


@pytest.mark.parametrize("case", FORM_CASES, ids=lambda c: c.dag_id)
def test_trigger_form_in_chromium_starts_a_run_with_the_changed_param(airflow_services,
                                                                      airflow_ui, case):
    api, page = airflow_services.api, airflow_ui
    api.unpause(case.dag_id)
    params = api.params(case.dag_id)
    section = params[case.param]["schema"].get("section") or UI_SECTION_DEFAULT
    before = api.run_ids(case.dag_id)

    page.goto(f"{airflow_services.base_url}/dags/{case.dag_id}")
    page.get_by_role("button", name="Trigger Dag", exact=True).click()
    form = page.get_by_role("dialog")
    section_button = form.get_by_role("button", name=section, exact=True)
    if section_button.get_attribute("aria-expanded") != "true":
        section_button.click()
    field = form.locator(f'[name="element_{case.param}"]')  # the form's name for a param
    field.fill(case.typed)
    field.blur()
    with page.expect_request(lambda r: r.method == "POST"
                             and r.url.endswith(f"/api/v2/dags/{case.dag_id}/dagRuns")) as sent:
        form.get_by_role("button", name="Trigger", exact=True).click()

    # The UI sends every param (what the REST tests send too), the changed one changed.
    defaults = {name: p["value"] for name, p in params.items()}
    assert sent.value.post_data_json["conf"] == defaults | {case.param: case.expected}
    run_id = api.wait_for_new_run(case.dag_id, before)
    run = api.wait_for_run(case.dag_id, run_id, case.run_timeout_s)
    assert run["conf"][case.param] == case.expected
