"""Comparisons and arg_max/arg_min: boolean and integer results, no gradient."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.framework.registry import get_op_def
from tests.runtime.gradcheck import forward

rng = np.random.default_rng(29)

COMPARES = {"equal": np.equal, "not_equal": np.not_equal, "less_than": np.less,
            "less_equal": np.less_equal, "greater_than": np.greater,
            "greater_equal": np.greater_equal}


@pytest.mark.parametrize("op", COMPARES)
def test_comparison_broadcasts_and_gives_bool(op):
    x = rng.integers(0, 3, (4, 3))
    y = rng.integers(0, 3, (3,))
    (out,) = forward(op, {"X": x, "Y": y})["Out"]
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, COMPARES[op](x, y))
    assert get_op_def(op).grad is None


@pytest.mark.parametrize("op, fn", [("arg_max", np.argmax), ("arg_min", np.argmin)])
@pytest.mark.parametrize("attrs, axis, keep", [
    ({"axis": 1}, 1, False), ({"axis": 0, "keepdims": True}, 0, True),
    ({"flatten": True}, None, False),
])
def test_arg_reductions_give_int64_indices(op, fn, attrs, axis, keep):
    x = rng.standard_normal((3, 4))
    (out,) = forward(op, {"X": x}, attrs)["Out"]
    assert out.dtype == np.int64
    expected = fn(x, axis=axis, keepdims=keep) if axis is not None else [fn(x)]
    np.testing.assert_array_equal(out, expected)
