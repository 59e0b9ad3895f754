"""relu, tanh, sigmoid, gelu, exp, log against numpy formulas and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ringflow.ops.activation import erf
from tests.runtime.gradcheck import check_grad, forward

rng = np.random.default_rng(5)


def away_from_zero(*shape):
    # finite differences across relu's kink would be meaningless
    return rng.uniform(0.1, 2.0, shape) * rng.choice([-1, 1], shape)


def _gelu_exact(x):
    flat = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel()]
    return np.array(flat).reshape(x.shape)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


FORMULAS = {
    "relu": (lambda x: np.maximum(x, 0), {}),
    "tanh": (np.tanh, {}),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), {}),
    "exp": (np.exp, {}),
}


@pytest.mark.parametrize("op", FORMULAS)
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2)])
def test_activation_matches_formula_and_gradient(op, shape):
    fn, attrs = FORMULAS[op]
    x = away_from_zero(*shape)
    (out,) = forward(op, {"X": x}, attrs)["Out"]
    np.testing.assert_allclose(out, fn(x), rtol=1e-12)
    check_grad(op, {"X": x}, attrs)


@pytest.mark.parametrize("op", [*FORMULAS, "gelu", "log"])
def test_activation_keeps_float32(op):
    x = rng.uniform(0.1, 1.0, (4, 3)).astype(np.float32)
    (out,) = forward(op, {"X": x})["Out"]
    assert out.dtype == np.float32


def test_sigmoid_does_not_overflow_for_large_inputs():
    (out,) = forward("sigmoid", {"X": np.array([-1000.0, 0.0, 1000.0])})["Out"]
    np.testing.assert_array_equal(out, [0.0, 0.5, 1.0])


def test_log_matches_numpy_and_gradient():
    x = rng.uniform(0.5, 3.0, (3, 3))
    np.testing.assert_allclose(forward("log", {"X": x})["Out"][0], np.log(x))
    check_grad("log", {"X": x})


@pytest.mark.parametrize("approximate, fn", [(False, _gelu_exact), (True, _gelu_tanh)])
def test_gelu_matches_formula_and_gradient(approximate, fn):
    x = rng.uniform(-4.0, 4.0, (4, 5))
    (out,) = forward("gelu", {"X": x}, {"approximate": approximate})["Out"]
    np.testing.assert_allclose(out, fn(x), rtol=1e-12, atol=1e-15)
    check_grad("gelu", {"X": x}, {"approximate": approximate})


def test_erf_matches_math_erf_everywhere():
    x = np.concatenate([np.linspace(-8, 8, 2001), [0.0, 2.9999, 3.0, 6.5, 40.0, -40.0]])
    np.testing.assert_allclose(erf(x), [math.erf(v) for v in x], rtol=0, atol=4e-15)
