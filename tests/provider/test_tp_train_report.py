"""The loss history of a training job's summary: bounded in XCom, whole in a file
(ringflow_provider.tp_train.report and .outcome, without Airflow or processes)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from ringflow.launch.leftovers import DAEMON_LOST_TAG
from ringflow_provider.launchers.job import JobHandle, TaskKey
from ringflow_provider.launchers.lines import TIMING, JobLine
from ringflow_provider.launchers.outcome import daemon_lost_failure
from ringflow_provider.tp_train import outcome
from ringflow_provider.tp_train.report import (
    XCOM_HISTORY_POINTS,
    JobReport,
    Presenter,
    loss_figure,
    read_history,
    stragglers,
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


def timing(step: int, own: list[float], wait: list[float]) -> JobLine:
    payload = {"step": step, "steps": 20, "hosts": ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
               "host_step_s": own, "host_wait_s": wait}
    return JobLine("10.0.0.2", "[rank 0] [train] timing " + json.dumps(payload), "stdout",
                   TIMING, payload)


def test_a_straggler_is_warned_of_once_until_it_falls_further_behind_or_catches_up():
    present = Presenter(120)
    # the first window is the warm-up: its times shown, no straggler named from it
    level, text = present(timing(20, [0.030, 0.010, 0.011], [0.001, 0.020, 0.019]))
    assert level == "info" and text.startswith("host step times, steps 1-20 ")
    level, text = present(timing(40, [0.010, 0.030, 0.011], [0.020, 0.001, 0.019]))
    assert level == "warning" and text == (
        "straggler: host 10.0.0.3 is 2.9 x slower than the other hosts, steps 21-40: its "
        "ranks' own work takes 0.0300 s per step, theirs 0.0105 s, and they wait 0.0195 s "
        "per step for it in the all-reduce")
    # as slow again: one line of each host's times, no new warning
    level, text = present(timing(60, [0.010, 0.031, 0.011], [0.020, 0.001, 0.019]))
    assert level == "info" and text == (
        "host step times, steps 41-60 (own work / waiting in the all-reduce, per step): "
        "10.0.0.2 0.0100 / 0.0200 s, 10.0.0.3 0.0310 / 0.0010 s, 10.0.0.4 0.0110 / 0.0190 s")
    assert present(timing(80, [0.010, 0.040, 0.011], [0.020, 0.001, 0.019]))[0] == "warning"
    assert present(timing(100, [0.010, 0.011, 0.011], [0.001, 0.001, 0.001]))[0] == "info"
    assert present(timing(120, [0.010, 0.030, 0.011], [0.020, 0.001, 0.019]))[0] == "warning"


def test_a_resumed_try_s_first_window_is_its_warm_up():
    present = Presenter(200, first_step=101)
    assert present(timing(120, [0.010, 0.030, 0.011], [0.020, 0.001, 0.019]))[0] == "info"
    assert present(timing(140, [0.010, 0.030, 0.011], [0.020, 0.001, 0.019]))[0] == "warning"


def test_tiny_differences_and_malformed_timing_lines_name_no_straggler():
    assert stragglers({"step": 20, "steps": 20, "hosts": ["a", "b"],
                       "host_step_s": [0.0010, 0.0025], "host_wait_s": [0.001, 0.0]}) == []
    assert stragglers({"step": 20, "steps": 20, "hosts": ["a", "b"],
                       "host_step_s": [0.01], "host_wait_s": [0.0, 0.0]}) == []


def test_the_report_carries_each_hosts_mean_step_times_over_every_window():
    report = JobReport()
    report.feed(timing(20, [0.010, 0.030, 0.012], [0.020, 0.0, 0.018]))
    report.feed(timing(40, [0.012, 0.050, 0.012], [0.040, 0.0, 0.040]))
    assert report.host_step_s() == {"10.0.0.2": 0.011, "10.0.0.3": 0.04, "10.0.0.4": 0.012}
    assert report.host_step_s(2) == {"10.0.0.2": 0.03, "10.0.0.3": 0.0, "10.0.0.4": 0.029}


def test_failures_of_different_hosts_are_ordered_on_the_launchers_clock():
    """The second host's clock 30 s behind: its rank's exit at 1000.5 on the launcher's
    clock reads 970.5 there; the first host's at 1000.0 came first."""
    report = JobReport()
    for host, rank, at in (("a", 0, 1000.0), ("b", 2, 970.5)):
        result = {"status": "failed", "failed_rank": rank,
                  "ranks": [{"rank": rank, "ended_at": at, "after_peer_failure": False}]}
        report.results[host] = result
    assert report.first_failure(["a", "b"])[0] == "b"  # by the hosts' own clocks
    assert report.first_failure(["a", "b"], {"a": 0.01, "b": 30.0})[0] == "a"


def test_a_failure_that_blamed_another_hosts_failed_rank_leads_to_that_one():
    """Rank 0 on a began to exit first, but it blamed rank 2, whose failure b reported (rank
    2 itself blamed rank 5, not among the job's failures: the chain ends there). In a cycle
    of blame the clock decides."""
    report = JobReport()
    for host, rank, at, blamed in (("a", 0, 999.0, 2), ("b", 2, 1000.0, 5)):
        report.results[host] = {"status": "failed", "failed_rank": rank, "ranks": [
            {"rank": rank, "ended_at": at, "after_peer_failure": True, "blamed_rank": blamed}]}
    assert report.first_failure(["a", "b"])[0] == "b"
    report.results["b"]["ranks"][0]["blamed_rank"] = 0  # a cycle: the clock decides
    assert report.first_failure(["a", "b"])[0] == "a"


def test_a_host_whose_daemon_mpirun_lost_is_named_when_no_rank_failed_first():
    """mpirun ends the job at once when it loses a host's daemon, often before any rank
    noticed: the launcher's own line names the host, and the failure is that host's."""
    report = JobReport()
    report.feed(JobLine("10.0.0.2", f"[launch] mpirun: 10.0.0.3 {DAEMON_LOST_TAG}: Open MPI's "
                        "daemon there went away", "stdout"))
    report.feed(JobLine("10.0.0.2", f"[rank 0] [launch] mpirun: 10.0.0.2 {DAEMON_LOST_TAG}: "
                        "forged", "stdout"))
    assert report.daemons_lost == ["10.0.0.3"]
    message, host = daemon_lost_failure(report, ["10.0.0.2", "10.0.0.3"], 2, 41)
    assert host == "10.0.0.3"
    assert message.startswith("training failed: lost contact with host 10.0.0.3 (ranks 2, 3) "
                              "after step 41: mpirun lost its Open MPI daemon there"), message
    assert daemon_lost_failure(JobReport(), ["10.0.0.2", "10.0.0.3"], 2, 41) is None


def test_a_hosts_clock_within_the_round_trip_of_its_reading_is_taken_as_agreeing():
    """A reading whose way back took 3 s (a busy worker) is no skew; 30 s behind is."""
    from ringflow_provider.launchers.clocks import clock_offset

    assert clock_offset(1000.0, 1003.0, 1000.2) == 0.0
    assert clock_offset(1000.0, 1000.1, 970.05) == 30.05
    assert clock_offset(1000.0, 1000.1, 1030.0) == -29.9


def test_the_failures_of_a_host_found_frozen_come_after_every_other_hosts():
    """The frozen host's rank failed when the launcher continued it to stop it; whatever
    time it reports (a clock's offset misread), the other host's failure comes first."""
    report = JobReport()
    for host, rank, at, blamed in (("a", 0, 1000.0, 3), ("b", 3, 999.0, 0)):
        report.results[host] = {"status": "failed", "failed_rank": rank, "ranks": [
            {"rank": rank, "ended_at": at, "after_peer_failure": True, "blamed_rank": blamed}]}
    assert report.first_failure(["a", "b"])[0] == "b"
    assert report.first_failure(["a", "b"], halted={"b"})[0] == "a"
