"""Training in the Airflow UI, against real Airflow services (api-server, scheduler with the
LocalExecutor, dag-processor, triggerer; SQLite) and Debian's Chromium: the task instance's
"Training" tab while the job runs and after, the DAG's "Training runs" tab, the "Training
curve" extra link, and the data endpoints' contract and access rules.

Two runs of the example DAG serve every test of the module: A (400 steps, a point every 5)
and B (40 steps, another learning rate), triggered together at the start.

With RINGFLOW_UI_SCREENSHOTS=<folder> the Chromium tests save the tabs as PNGs there
(scripts/ui_screenshots.sh makes the README's pictures this way).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.airflow_services import OUTSIDER, AirflowAPI
from tests.provider.conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.airflow, pytest.mark.slow, pytest.mark.multiproc]

DAG, TASK = "ringflow_tp_train", "train"
A_CONF = {"steps": 400, "log_every": 5, "seed": 3}
B_CONF = {"steps": 40, "log_every": 5, "seed": 3, "learning_rate": 0.001}
# C's loss becomes inf at once: the job fails, and a retry would not help (none is made)
C_CONF = {"steps": 40, "log_every": 1, "seed": 3, "optimizer_type": "sgd",
          "learning_rate": 1e30}
A_STEPS = [1, *range(5, 401, 5)]   # steps / log_every points, and the first
SCREENSHOTS = os.environ.get("RINGFLOW_UI_SCREENSHOTS")


@pytest.fixture(scope="module")
def runs(airflow_services) -> dict[str, str]:
    api = airflow_services.api
    c = api.trigger_form(DAG, **C_CONF)   # first: A and B are the newest runs
    return {"A": api.trigger_form(DAG, **A_CONF), "B": api.trigger_form(DAG, **B_CONF), "C": c}


def task_tab(base_url: str, run_id: str) -> str:
    return f"{base_url}/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/{TASK}/plugin/training"


def tab_frame(page):
    """The plugin page inside the UI's tab (an iframe of /ringflow/...)."""
    return page.frame_locator("iframe[src*='/ringflow/']")


def drawn_points(frame) -> int:
    """The points drawn in the loss chart: each try's line has `data-points` vertices."""
    return frame.locator("#loss-chart svg").evaluate(
        "svg => [...svg.querySelectorAll('path.series')]"
        ".reduce((n, p) => n + Number(p.dataset.points), 0)")


def screenshot(page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / name), full_page=False)


def test_installing_the_package_registers_the_plugin_once_with_both_tabs(airflow_services):
    api = airflow_services.api
    plugins = {p["name"]: p for p in api.get("/plugins?limit=100")["plugins"]}
    ringflow = plugins["ringflow"]
    assert [(a["url_prefix"], a["name"]) for a in ringflow["fastapi_apps"]] == \
        [("/ringflow", "ringflow training")]
    assert sorted((v["name"], v["destination"], v["url_route"])
                  for v in ringflow["external_views"]) == \
        [("Training", "task_instance", "training"), ("Training runs", "dag", "training-runs")]
    assert api.get("/plugins/importErrors")["import_errors"] == []


def test_the_training_tab_draws_more_points_while_the_job_runs_and_all_after(
        airflow_services, airflow_ui, runs):
    api, page = airflow_services.api, airflow_ui
    api.wait_for_state(DAG, runs["A"], TASK, {"running"}, timeout=120)
    metrics = f"{airflow_services.base_url}/ringflow/api/metrics/{DAG}/{quote(runs['A'])}/{TASK}"
    wait_until(lambda: len(api.http.get(metrics).json()["tries"][0]["points"]) >= 3, 120,
               "three progress points in try 1's log")
    page.set_viewport_size({"width": 1280, "height": 1080})
    page.goto(task_tab(airflow_services.base_url, runs["A"]))
    frame = tab_frame(page)
    frame.locator("#loss-chart path.series").first.wait_for()
    frame.locator("body").evaluate("b => { window.ringflowLook = 'first page load'; }")
    first = drawn_points(frame)
    assert 3 <= first < len(A_STEPS)

    wait_until(lambda: drawn_points(frame) > first, 60, "more points drawn", step=0.5)
    # the same page, not a reload: what the first look left on it is still there
    assert frame.locator("body").evaluate("b => window.ringflowLook") == "first page load"
    api.wait_for_run(DAG, runs["A"], timeout=240)
    wait_until(lambda: drawn_points(frame) == len(A_STEPS), 30, "every point drawn", step=0.5)
    summary = frame.locator("#summary-table")
    summary.wait_for()
    final_loss = api.xcom(DAG, runs["A"], TASK)["final_loss"]
    shown = dict(zip(summary.locator("th").all_inner_texts(),
                     summary.locator("td").all_inner_texts()))
    assert (shown["final loss"], shown["steps"], shown["layout (mp × dp)"]) == \
        (f"{final_loss:.5g}", "400", "mp 2 × dp 1")
    assert frame.locator("#loss-chart text", has_text="step").count() >= 1   # axis labels
    assert frame.locator("#loss-chart text", has_text="loss (nats)").count() == 1
    screenshot(page, "training-tab.png")
    frame.locator("#show-lr").check()
    lr = frame.locator("#lr-chart path.series")
    lr.wait_for(state="attached")   # a constant rate: a flat line, which has no height
    assert lr.get_attribute("data-points") == str(len(A_STEPS))
    assert frame.locator("#lr-chart text", has_text="learning rate").count() >= 1
    light = frame.locator("body").evaluate("b => getComputedStyle(b).backgroundColor")
    # the tab follows the UI into dark mode (the UI follows the system's by default)
    page.emulate_media(color_scheme="dark")
    frame.locator("html.dark").wait_for(state="attached")
    dark = frame.locator("body").evaluate("b => getComputedStyle(b).backgroundColor")
    assert (light, dark) == ("rgb(255, 255, 255)", "rgb(17, 24, 39)")
    screenshot(page, "training-tab-dark.png")
    page.emulate_media(color_scheme="light")


def test_the_metrics_endpoint_answers_each_trys_points_whose_losses_are_the_xcoms(
        airflow_services, runs):
    api = airflow_services.api
    api.wait_for_run(DAG, runs["A"], timeout=240)
    answer = api.http.get(f"{airflow_services.base_url}/ringflow/api/metrics/{DAG}/"
                          f"{quote(runs['A'], safe='')}/{TASK}").json()
    (only,) = answer["tries"]
    assert (only["try_number"], only["state"], only["failure"]) == (1, "success", None)
    history = api.xcom(DAG, runs["A"], TASK)["loss_history"]
    assert [[p["step"], p["loss"]] for p in only["points"]] == history   # same floats
    assert [p["step"] for p in only["points"]] == A_STEPS
    assert all(p["lr"] == 0.003 and p["samples_per_s"] > 0 for p in only["points"][1:])
    summary = answer["summary"]
    assert summary["steps"] == 400 and summary["final_loss"] == history[-1][1]
    assert (summary["world_size"], summary["mp_degree"], summary["dp_degree"]) == (2, 2, 1)
    assert "loss_history" not in summary


def test_the_training_runs_tab_overlays_the_runs_and_highlights_the_param_that_differs(
        airflow_services, airflow_ui, runs):
    api, page = airflow_services.api, airflow_ui
    for run_id in (runs["A"], runs["B"]):
        api.wait_for_run(DAG, run_id, timeout=240)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{airflow_services.base_url}/dags/{DAG}/plugin/training-runs")
    frame = tab_frame(page)
    # this module's three runs are the newest: show those only (the DAG has runs of other
    # tests, with other confs, in the same Airflow)
    frame.locator("#limit").select_option("3")
    frame.locator("#status").filter(has_text="3 runs with training").wait_for()
    for run_id in (runs["A"], runs["B"]):
        frame.locator(f"#loss-chart path.series[data-series='{run_id}']").wait_for()
    points = {run_id: int(frame.locator(f"#loss-chart path.series[data-series='{run_id}']")
                          .get_attribute("data-points")) for run_id in (runs["A"], runs["B"])}
    assert points == {runs["A"]: len(A_STEPS), runs["B"]: 9}
    differs = frame.locator("thead th.differs").all_inner_texts()
    assert "learning_rate" in differs and "model" not in differs
    row = frame.locator(f"tr.run[data-run-id='{runs['B']}']")
    assert "differs" in row.locator("td[data-param='learning_rate']").get_attribute("class")
    assert row.locator("td[data-param='learning_rate']").inner_text() == "0.001"
    screenshot(page, "training-runs-tab.png")

    row.click()   # opens run B's Training tab in the UI
    page.wait_for_url(task_tab(airflow_services.base_url, runs["B"]), wait_until="commit")
    frame = tab_frame(page)
    frame.locator("#summary-table").wait_for()
    assert drawn_points(frame) == 9


def test_the_training_curve_extra_link_opens_the_task_instances_tab(
        airflow_services, airflow_ui, runs):
    api, page = airflow_services.api, airflow_ui
    api.wait_for_run(DAG, runs["B"], timeout=240)
    links = api.get(f"/dags/{DAG}/dagRuns/{quote(runs['B'], safe='')}/taskInstances/{TASK}/"
                    f"links")
    url = links["extra_links"]["Training curve"]
    assert url == task_tab(airflow_services.base_url, runs["B"])
    page.goto(url)
    assert drawn_points_when_shown(tab_frame(page)) == 9


def drawn_points_when_shown(frame) -> int:
    frame.locator("#summary-table").wait_for()
    return drawn_points(frame)


def test_the_endpoints_answer_401_403_404_and_422_as_airflows_api_does(airflow_services,
                                                                       runs):
    base = airflow_services.base_url
    admin = airflow_services.api.http
    airflow_services.api.wait_for_run(DAG, runs["B"], timeout=240)
    metrics = f"{base}/ringflow/api/metrics/{DAG}/{quote(runs['B'], safe='')}/{TASK}"
    outsider = AirflowAPI.login(base, OUTSIDER, airflow_services.password(OUTSIDER))
    try:
        # a signed-in user who may not read the DAG: refused here as by the REST API
        assert outsider.http.get(f"/dags/{DAG}").status_code == 403
        assert outsider.http.get(metrics).status_code == 403
        assert outsider.http.get(f"{base}/ringflow/api/runs/{DAG}").status_code == 403
    finally:
        outsider.close()
    assert httpx.get(metrics).status_code == 401   # no credentials
    assert admin.get(metrics).status_code == 200
    missing = {
        f"{base}/ringflow/api/metrics/{DAG}/no_such_run/{TASK}": "has no run 'no_such_run'",
        f"{base}/ringflow/api/metrics/{DAG}/{quote(runs['B'], safe='')}/no_task":
            "has no task 'no_task'",
        f"{base}/ringflow/api/runs/no_such_dag": "no DAG 'no_such_dag'",
    }
    for url, detail in missing.items():
        response = admin.get(url)
        assert (response.status_code, detail in response.json()["detail"]) == (404, True), url
    for url in (f"{base}/ringflow/api/metrics/bad%20dag!/{quote(runs['B'])}/{TASK}",
                f"{base}/ringflow/api/runs/{DAG}?limit=0",
                f"{base}/ringflow/api/runs/{DAG}?limit=101",
                f"{metrics}?map_index=-2"):
        assert admin.get(url).status_code == 422, url
    listed = admin.get(f"{base}/ringflow/api/runs/{DAG}?limit=2").json()["runs"]
    assert [r["run_id"] for r in listed] == [runs["B"], runs["A"]]
    b = listed[0]
    assert b["conf"]["learning_rate"] == 0.001 and b["task_id"] == TASK
    assert b["state"] == "success" and b["duration_s"] > 0
    assert b["final_loss"] == airflow_services.api.xcom(DAG, runs["B"], TASK)["final_loss"]
    assert b["samples_per_s"] > 0


def test_a_failed_jobs_tab_shows_why_it_failed_naming_the_rank(airflow_services, airflow_ui,
                                                               runs):
    api, page = airflow_services.api, airflow_ui
    api.wait_for_state(DAG, runs["C"], TASK, {"failed"}, timeout=180)
    answer = api.get(f"{airflow_services.base_url}/ringflow/api/metrics/{DAG}/"
                     f"{quote(runs['C'], safe='')}/{TASK}")
    (only,) = answer["tries"]   # not retried: the loss diverged, a retry would too
    assert (only["state"], answer["summary"]) == ("failed", None)
    assert re.match(r"RingflowJobRefusedException: training failed: rank \d on host \S+ "
                    r"\(pid \d+\) failed first with exit code 3: \[train\] error: stopping: "
                    r"the loss is (nan|inf)", only["failure"]), only["failure"]
    page.goto(task_tab(airflow_services.base_url, runs["C"]))
    failure = tab_frame(page).locator(".failure[data-try='1']")
    failure.wait_for()
    assert failure.inner_text().startswith("try 1 failed")
    assert only["failure"].splitlines()[0] in failure.inner_text()


def test_the_training_tab_of_a_deferred_task_draws_more_points_while_it_runs(
        airflow_services, airflow_ui, runs):
    """The triggerer watches the job and writes its progress lines into the task's log: the
    tab reads them through Airflow's log reader as it does a running task's."""
    api, page = airflow_services.api, airflow_ui
    run = api.trigger_form(DAG, deferrable=True, poll_interval=1, **A_CONF)
    api.wait_for_state(DAG, run, TASK, {"deferred"}, timeout=120)
    metrics = f"{airflow_services.base_url}/ringflow/api/metrics/{DAG}/{quote(run)}/{TASK}"
    wait_until(lambda: len(api.http.get(metrics).json()["tries"][0]["points"]) >= 3, 120,
               "three progress points in the deferred try's log")
    page.goto(task_tab(airflow_services.base_url, run))
    frame = tab_frame(page)
    frame.locator("#loss-chart path.series").first.wait_for()
    first = drawn_points(frame)
    assert 3 <= first < len(A_STEPS)
    wait_until(lambda: drawn_points(frame) > first, 60, "more points drawn", step=0.5)
    api.wait_for_run(DAG, run, timeout=240)
    wait_until(lambda: drawn_points(frame) == len(A_STEPS), 30, "every point drawn", step=0.5)
    frame.locator("#summary-table").wait_for()
