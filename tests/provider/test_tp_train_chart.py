"""The text loss chart of the task log (ringflow_provider.tp_train.report.text_chart), drawn
from hand-made series: exact pictures of small ones, and what every chart keeps (one star per
column, the highest column in the top row, the lowest in the bottom row, the first and last
step at the ends)."""

from __future__ import annotations

import random

import pytest

from ringflow_provider.tp_train.report import text_chart


def picture(*lines: str) -> str:
    return "\n".join(lines)


def test_a_40_step_run_logging_5_points_draws_each_point_in_its_own_column():
    history = [(1, 2.3), (10, 1.9), (20, 1.5), (30, 1.2), (40, 1.0)]
    assert text_chart(history) == picture(
        "2.3 |*",
        "    |",
        "    |",
        "    | *",
        "    |",
        "    |",
        "    |  *",
        "    |",
        "    |   *",
        "  1 |    *",
        "    +-----",
        "     step 1  step 40")


def test_a_curve_that_falls_then_rises_puts_its_ends_and_its_minimum_where_they_are():
    history = [(1, 4.0), (2, 1.0), (3, 2.0), (4, 3.0)]
    assert text_chart(history, height=4) == picture(
        "4 |*",
        "  |   *",
        "  |  *",
        "1 | *",
        "  +----",
        "   step 1  step 4")


def test_more_points_than_columns_are_averaged_in_even_runs_of_consecutive_points():
    history = [(1, 8.0), (2, 6.0), (3, 4.0), (4, 4.0), (5, 2.0), (6, 0.0)]
    # width 3: runs (8, 6), (4, 4), (2, 0) -> 7, 4, 1
    assert text_chart(history, width=3, height=3) == picture(
        "7 |*",
        "  | *",
        "1 |  *",
        "  +---",
        "   step 1  step 6")


def test_a_flat_curve_is_one_row_labelled_with_its_loss():
    assert text_chart([(1, 0.5), (2, 0.5), (3, 0.5)]) == picture(
        "0.5 |***",
        "    +---",
        "     step 1  step 3")


@pytest.mark.parametrize("history", [[], [(1, 2.0)]])
def test_fewer_than_two_points_draw_no_chart(history):
    assert text_chart(history) == ""


def series(points: int, seed: int) -> list[tuple[int, float]]:
    """A noisy falling loss logged every 10 steps from step 1 (the shape of a real run)."""
    rng = random.Random(seed)
    return [(1 + 10 * i, 3.0 / (1 + i) + rng.uniform(0, 0.3)) for i in range(points)]


@pytest.mark.parametrize(("points", "width", "height"),
                         [(2, 60, 10), (5, 60, 10), (7, 5, 4), (59, 60, 10), (60, 60, 10),
                          (61, 60, 10), (119, 60, 10), (1000, 60, 10), (37, 8, 6),
                          (250, 17, 3)])
def test_every_chart_has_one_star_per_column_and_uses_its_top_and_bottom_rows(
        points, width, height):
    for seed in range(5):
        history = series(points, seed)
        lines = text_chart(history, width=width, height=height).split("\n")
        rows = [line.split("|", 1)[1].ljust(min(points, width)) for line in lines[:height]]
        columns = ["".join(row[x] for row in rows) for x in range(min(points, width))]
        assert sum(row.count("*") for row in rows) == min(points, width)
        assert all(column.count("*") == 1 for column in columns)
        assert "*" in rows[0] and "*" in rows[-1]
        assert lines[height].endswith("+" + "-" * min(points, width))
        assert lines[-1].split() == ["step", "1", "step", str(history[-1][0])]
