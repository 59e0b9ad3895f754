"""Creation ops: constant fills, seeded random fills, copies."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ExecutionError
from tests.runtime.gradcheck import check_grad, forward


def test_fill_constant_fills_shape_with_value_in_dtype():
    attrs = {"shape": [2, 3], "dtype": "float32", "value": 1.5}
    (out,) = forward("fill_constant", {}, attrs)["Out"]
    np.testing.assert_array_equal(out, np.full((2, 3), 1.5, np.float32))


def test_fill_constant_accepts_paddle_dtype_codes():
    (out,) = forward("fill_constant", {}, {"shape": [4], "dtype": 3, "value": 7})["Out"]
    assert out.dtype == np.int64 and out.tolist() == [7, 7, 7, 7]


def test_fill_constant_with_unknown_dim_is_an_execution_error():
    with pytest.raises(ExecutionError, match="fully known"):
        forward("fill_constant", {}, {"shape": [-1, 3], "value": 0.0})


@pytest.mark.parametrize("op, attrs, draw", [
    ("uniform_random", {"min": -0.5, "max": 2.0},
     lambda rng, shape: rng.uniform(-0.5, 2.0, shape)),
    ("gaussian_random", {"mean": 1.0, "std": 0.25},
     lambda rng, shape: rng.normal(1.0, 0.25, shape)),
])
def test_random_fill_draws_from_default_rng_of_its_seed(op, attrs, draw):
    attrs = {**attrs, "shape": [3, 5], "dtype": "float32", "seed": 1234}
    (out,) = forward(op, {}, attrs)["Out"]
    expected = draw(np.random.default_rng(1234), (3, 5)).astype(np.float32)
    np.testing.assert_array_equal(out, expected)


def test_random_fills_with_different_seeds_differ():
    a = forward("uniform_random", {}, {"shape": [8], "seed": 1})["Out"][0]
    b = forward("uniform_random", {}, {"shape": [8], "seed": 2})["Out"][0]
    assert not np.array_equal(a, b)


def test_random_fill_with_seed_zero_is_still_deterministic():
    a = forward("gaussian_random", {}, {"shape": [8], "seed": 0})["Out"][0]
    b = forward("gaussian_random", {}, {"shape": [8], "seed": 0})["Out"][0]
    np.testing.assert_array_equal(a, b)


def test_assign_copies_its_input():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = forward("assign", {"X": x})["Out"]
    np.testing.assert_array_equal(out, x)


def test_assign_grad_passes_gradient_through():
    check_grad("assign", {"X": np.random.default_rng(0).standard_normal((3, 2))})


def test_fill_zeros_like_keeps_shape_and_dtype():
    (out,) = forward("fill_zeros_like", {"X": np.ones((2, 2), np.float32)})["Out"]
    np.testing.assert_array_equal(out, np.zeros((2, 2), np.float32))
