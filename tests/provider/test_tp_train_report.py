"""The loss history of a training job's summary: bounded in XCom, whole in a file
(ringflow_provider.tp_train.report and .outcome, without Airflow or processes)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from ringflow_provider.launchers.job import JobHandle, TaskKey
from ringflow_provider.tp_train import outcome
from ringflow_provider.tp_train.report import (
    XCOM_HISTORY_POINTS,
    JobReport,
    loss_figure,
    read_history,
    thin_history,
)


def history(steps: int) -> list[tuple[int, float]]:
    return [(step, 10.0 / step) for step in range(1, steps + 1)]


@pytest.mark.parametrize("points", [0, 1, 999, 1000])
def test_a_history_that_fits_stays_whole(points):
    assert thin_history(history(points)) == history(points)


@pytest.mark.parametrize("points", [1001, 2500, 100_000])
def test_a_long_history_keeps_1000_evenly_spaced_points_with_the_first_and_last(points):
    full = history(points)
    thinned = thin_history(full)
    steps = [s for s, _ in thinned]
    assert (len(thinned), steps[0], steps[-1]) == (XCOM_HISTORY_POINTS, 1, points)
    assert len(set(steps)) == XCOM_HISTORY_POINTS and steps == sorted(steps)
    assert set(thinned) <= set(full)                      # points, not averages
    gaps = {b - a for a, b in pairwise(steps)}
    ideal = (points - 1) / (XCOM_HISTORY_POINTS - 1)
    assert max(gaps) - min(gaps) <= 1 and min(gaps) >= int(ideal)


def test_the_summary_bounds_its_history_and_names_the_file_with_all_of_it(tmp_path):
    report = JobReport()
    report.history = [(step, 1.0 + 1.0 / step) for step in range(1, 2501)]
    report.summary = {"final_loss": report.history[-1][1], "steps": 2500}
    handle = JobHandle(launcher="local", job_id="j1", task=TaskKey("d", "t", "r", 1),
                       hosts=("worker",), parts=(), python="python3", show_hosts=False,
                       log_dir=str(tmp_path), extra={"nproc_per_host": 2, "mp_degree": 2})
    summary, _ = outcome.summarize(handle, report, "t")
    assert len(summary["loss_history"]) == XCOM_HISTORY_POINTS
    assert summary["loss_history"][0] == [1, 2.0]
    assert summary["loss_history"][-1] == [2500, 1.0 + 1.0 / 2500]
    assert summary["loss_history_file"] == str(tmp_path / "loss_history.jsonl")
    assert read_history(tmp_path / "loss_history.jsonl") == report.history
    first = (tmp_path / "loss_history.jsonl").read_text().splitlines()[0]
    assert json.loads(first) == {"step": 1, "loss": 2.0}
    assert len(json.dumps(summary)) < 40_000                     # XCom stays small


def test_the_loss_plot_names_dag_run_and_task_labels_its_axes_and_marks_the_resume(
        tmp_path):
    import matplotlib.pyplot as plt

    report = JobReport()
    report.history = [(step, 2.0 / step) for step in range(121, 201)]
    report.summary = {"final_loss": report.history[-1][1], "steps": 200, "resumed_from": 120}
    handle = JobHandle(launcher="local", job_id="j2",
                       task=TaskKey("ringflow_tp_train", "train", "manual__1", 2),
                       hosts=("worker",), parts=(), python="python3", show_hosts=False,
                       log_dir=str(tmp_path), extra={"nproc_per_host": 2, "mp_degree": 2,
                                                     "model": "transformer"})
    summary, _ = outcome.summarize(handle, report, "train")
    assert summary["plot"] == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    title = outcome.plot_title(handle, "train")
    assert title == ("ringflow_tp_train / manual__1 / train (try 2)\n"
                     "transformer, mp 2 x dp 1")

    fig = loss_figure(plt, report.history, title, resumed_from=120)
    try:
        (ax,) = fig.axes
        assert ax.get_title() == title
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("step", "loss (nats, mean over the "
                                                      "global batch)")
        resume = [line for line in ax.get_lines() if line.get_label().startswith("resumed")]
        assert [(line.get_label(), list(line.get_xdata())) for line in resume] == \
            [("resumed from the checkpoint of step 120", [120, 120])]
    finally:
        plt.close(fig)
