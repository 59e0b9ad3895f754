"""check_finite_and_unscale, update_loss_scaling, skip_update_begin/end: kernels against
direct numpy formulas (Paddle's semantics), shape inference, and no gradient."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.framework.registry import get_op_def
from tests.runtime.gradcheck import forward

rng = np.random.default_rng(5)
AMP_OPS = ["check_finite_and_unscale", "update_loss_scaling", "skip_update_begin",
           "skip_update_end"]


@pytest.mark.parametrize("op_type", AMP_OPS)
def test_amp_ops_have_no_gradient(op_type):
    assert get_op_def(op_type).grad is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_check_finite_and_unscale_divides_by_the_scale_and_finds_nothing(dtype):
    xs = [rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal(5).astype(dtype)]
    scale = np.array([1024.0], np.float32)
    result = forward("check_finite_and_unscale", {"X": xs, "Scale": scale},
                     outputs={"Out": 2, "FoundInfinite": 1})
    inverse = np.float32(1.0) / scale[0]
    for x, out in zip(xs, result["Out"]):
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, (x * inverse).astype(dtype))
    np.testing.assert_array_equal(result["FoundInfinite"][0], np.array([False]))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_check_finite_and_unscale_finds_an_inf_or_nan_in_any_input(bad):
    xs = [np.ones((2, 2), np.float32), np.ones(3, np.float32)]
    xs[1][2] = bad
    result = forward("check_finite_and_unscale", {"X": xs, "Scale": np.array([2.0], np.float32)},
                     outputs={"Out": 2, "FoundInfinite": 1})
    np.testing.assert_array_equal(result["FoundInfinite"][0], np.array([True]))
    np.testing.assert_array_equal(result["Out"][0], np.full((2, 2), 0.5, np.float32))


def _scaling(found: bool, scale: float, good: int, bad: int, **attrs):
    grads = [np.full((2, 3), 7.0, np.float32)]
    inputs = {"X": grads, "FoundInfinite": np.array([found]),
              "PrevLossScaling": np.array([scale], np.float32),
              "InGoodSteps": np.array([good], np.int32), "InBadSteps": np.array([bad], np.int32)}
    outputs = {"Out": 1, "LossScaling": 1, "OutGoodSteps": 1, "OutBadSteps": 1}
    r = forward("update_loss_scaling", inputs, {"incr_every_n_steps": 3,
                                                "decr_every_n_nan_or_inf": 2, "incr_ratio": 2.0,
                                                "decr_ratio": 0.5, **attrs}, outputs)
    return (r["Out"][0], float(r["LossScaling"][0][0]), int(r["OutGoodSteps"][0][0]),
            int(r["OutBadSteps"][0][0]))


@pytest.mark.parametrize("found, scale, good, bad, expected", [
    (False, 8.0, 0, 1, (8.0, 1, 0)),        # a good step: counted, the bad run ends
    (False, 8.0, 2, 0, (16.0, 0, 0)),       # the 3rd good step in a row: scale * incr_ratio
    (False, 3e38, 2, 0, (3e38, 0, 0)),      # a scale that would overflow stays
    (True, 8.0, 2, 0, (8.0, 0, 1)),         # the 1st bad step: counted, the good run ends
    (True, 8.0, 0, 1, (4.0, 0, 0)),         # the 2nd: scale * decr_ratio
    (True, 1.5, 0, 1, (1.0, 0, 0)),         # never below 1
], ids=["good", "grow", "no-overflow", "bad", "shrink", "floor"])
def test_update_loss_scaling_follows_paddles_rule(found, scale, good, bad, expected):
    out, *state = _scaling(found, scale, good, bad)
    assert tuple(state) == pytest.approx(expected)
    np.testing.assert_array_equal(out, np.zeros((2, 3)) if found else np.full((2, 3), 7.0))


def test_update_loss_scaling_with_stop_update_keeps_scale_and_counters():
    _, *state = _scaling(True, 8.0, 0, 1, stop_update=True)
    assert tuple(state) == (8.0, 0, 1)


def _bracketed_update(found: bool) -> tuple[np.ndarray, rf.Scope]:
    """skip_update_begin, an in-place update of a persistable ``w``, skip_update_end."""
    main = rf.Program()
    block = main.global_block()
    w = block.create_var(name="w", shape=[3], dtype="float32", persistable=True)
    flag = block.create_var(name="found", shape=[1], dtype="bool", is_data=True)
    saved = block.create_var(name="w@SKIP_UPDATE", shape=[3], dtype="float32")
    block.append_op("skip_update_begin", inputs={"X": [w], "FoundInfinite": [flag]},
                    outputs={"Saved": [saved]})
    block.append_op("scale", inputs={"X": [w]}, outputs={"Out": [w]}, attrs={"scale": 3.0})
    block.append_op("skip_update_end", inputs={"Saved": [saved], "FoundInfinite": [flag]},
                    outputs={"Out": [w]})
    rf.verify(main)
    scope = rf.Scope()
    scope["w"] = np.array([1.0, 2.0, 3.0], np.float32)
    rf.Executor().run(main, feed={"found": np.array([found])}, scope=scope)
    return scope["w"], scope


def test_skip_update_pair_restores_what_the_update_wrote_when_inf_was_found():
    w, scope = _bracketed_update(True)
    np.testing.assert_array_equal(w, [1.0, 2.0, 3.0])
    assert "w@SKIP_UPDATE" not in scope       # the copy leaves with the step


def test_skip_update_pair_lets_a_finite_step_update_and_copies_nothing():
    w, scope = _bracketed_update(False)
    np.testing.assert_array_equal(w, [3.0, 6.0, 9.0])
    assert "w@SKIP_UPDATE" not in scope
