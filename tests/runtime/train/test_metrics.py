"""The machine-readable lines: ``parse_train_line`` reads metric and summary lines as the
worker prints them and as the launcher forwards them, floats come back bitwise, and every
other line is not one."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ringflow.train.metrics import Reporter, format_line, parse_train_line

METRIC = {"step": 40, "loss": float(np.float32(0.41320812)), "lr": 1e-3,
          "samples_per_s": 1850.25, "elapsed_s": 0.6931471805599453}
SUMMARY = {"final_loss": 0.1 + 0.2, "steps": 200, "samples_per_s": None,
           "checkpoint": "/ck/step-00000200", "resumed_from": 40}


@pytest.mark.parametrize("prefix", ["", "[rank 0] ", "[rank 12] ", "[10.0.0.2/rank 3] "])
def test_metric_and_summary_lines_parse_with_or_without_the_launcher_prefix(prefix):
    assert parse_train_line(prefix + format_line("metric", METRIC)) == ("metric", METRIC)
    assert parse_train_line(prefix + format_line("summary", SUMMARY) + "\n") == (
        "summary", SUMMARY)


def test_the_exact_line_format():
    line = format_line("metric", {"step": 1, "loss": 2.5, "lr": 0.1, "samples_per_s": 10.0,
                                  "elapsed_s": 0.5})
    assert line == ('[train] metric {"step": 1, "loss": 2.5, "lr": 0.1, '
                    '"samples_per_s": 10.0, "elapsed_s": 0.5}')


def test_losses_read_back_bitwise():
    values = [float(np.float32(x)) for x in np.random.default_rng(0).random(50)]
    values += list(np.random.default_rng(1).random(50) * 1e-7)
    for v in values:
        _, payload = parse_train_line(format_line("metric", {**METRIC, "loss": v}))
        assert payload["loss"] == v and np.float64(payload["loss"]).tobytes() == \
            np.float64(v).tobytes()


@pytest.mark.parametrize("line", [
    "[train] resuming from step 40: /ck/step-00000040",
    "[train] checkpoint step 100: /ck/step-00000100",
    "[rank 0] [train] error: stopping: the loss is nan at step 7",
    "[train] metric not json",
    "[train] metric [1, 2]",
    '[train] metric {"step": 1',
    '[train] metrics {"step": 1}',
    '[rank x] [train] metric {"step": 1}',
    '[launch] result {"exit_code": 0}',
    'prefix [train] metric {"step": 1}',
    "",
])
def test_other_lines_are_not_train_lines(line):
    assert parse_train_line(line) is None


def test_nan_is_refused_when_formatting():
    with pytest.raises(ValueError):
        format_line("metric", {**METRIC, "loss": float("nan")})


def test_reporter_prints_only_when_enabled_and_counts_rates_from_the_last_line():
    out = io.StringIO()
    rep = Reporter(out, True, global_batch_size=8)
    rep.step_done(1, 1.5, 0.1, log=True)
    rep.step_done(2, 1.4, 0.1, log=False)
    rep.step_done(3, 1.3, 0.1, log=True)
    rep.say("hello")
    summary = rep.summary(1.3, 3, None, None)
    lines = [parse_train_line(line) for line in out.getvalue().splitlines()]
    assert [p[1]["step"] for p in lines if p and p[0] == "metric"] == [1, 3]
    assert out.getvalue().splitlines()[2] == "[train] hello"
    assert lines[-1] == ("summary", summary) and summary["steps"] == 3
    assert summary["samples_per_s"] > 0
    quiet = io.StringIO()
    Reporter(quiet, False, 8).summary(1.0, 1, None, None)
    assert quiet.getvalue() == ""
    assert Reporter(quiet, True, 8).summary(1.0, 1, None, 1)["samples_per_s"] is None
