"""scale, cast, sum, mean, reduce_sum, reduce_mean, sqrt, square: kernels against numpy,
gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ProgramError
from tests.runtime.gradcheck import build, check_grad, forward

rng = np.random.default_rng(7)


def randn(*shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("bias_after_scale, expected", [(True, 2.0 * 3 + 1), (False, 2.0 * 4)])
def test_scale_applies_bias_before_or_after_scaling(bias_after_scale, expected):
    x = np.full((2, 2), 3.0, np.float32)
    attrs = {"scale": 2.0, "bias": 1.0, "bias_after_scale": bias_after_scale}
    (out,) = forward("scale", {"X": x}, attrs)["Out"]
    np.testing.assert_array_equal(out, np.full((2, 2), expected, np.float32))


def test_scale_gradient_is_scaled_output_gradient():
    check_grad("scale", {"X": randn(3, 4)}, {"scale": -1.5, "bias": 2.0})


def test_cast_converts_dtype_and_casts_gradient_back():
    x = randn(2, 3)
    (out,) = forward("cast", {"X": x}, {"in_dtype": "float64", "out_dtype": "float32"})["Out"]
    np.testing.assert_array_equal(out, x.astype(np.float32))
    check_grad("cast", {"X": x}, {"in_dtype": "float64", "out_dtype": "float64"})


def test_cast_to_integer_has_no_gradient():
    from ringflow.framework.registry import get_op_def

    _, op, _ = build("cast", {"X": randn(2)}, {"in_dtype": "float64", "out_dtype": "int64"})
    assert get_op_def("cast").grad(op, frozenset()) == []


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sum_adds_all_inputs(n):
    xs = [randn(3, 2) for _ in range(n)]
    (out,) = forward("sum", {"X": xs})["Out"]
    np.testing.assert_allclose(out, np.sum(xs, axis=0), rtol=1e-12)
    check_grad("sum", {"X": xs})


def test_sum_keeps_float32():
    (out,) = forward("sum", {"X": [randn(4, dtype=np.float32)] * 3})["Out"]
    assert out.dtype == np.float32


def test_mean_is_shape_one_average():
    x = randn(4, 5)
    (out,) = forward("mean", {"X": x})["Out"]
    np.testing.assert_allclose(out, [x.mean()], rtol=1e-12)
    check_grad("mean", {"X": x})


@pytest.mark.parametrize("op, fn", [("reduce_sum", np.sum), ("reduce_mean", np.mean)])
@pytest.mark.parametrize("attrs, axis, keep", [
    ({"dim": [0]}, (0,), False),
    ({"dim": [-1], "keep_dim": True}, (2,), True),
    ({"dim": [0, 2]}, (0, 2), False),
    ({"reduce_all": True}, None, False),
])
def test_reduce_matches_numpy_and_its_gradient(op, fn, attrs, axis, keep):
    x = randn(2, 3, 4)
    (out,) = forward(op, {"X": x}, attrs)["Out"]
    expected = fn(x, axis=axis, keepdims=keep)
    np.testing.assert_allclose(out, np.reshape(expected, out.shape), rtol=1e-12)
    assert out.shape == (np.shape(expected) or (1,))
    check_grad(op, {"X": x}, attrs)


def test_reduce_mean_over_everything_is_shape_one_in_float32():
    (out,) = forward("reduce_mean", {"X": randn(3, 3, dtype=np.float32)},
                     {"reduce_all": True})["Out"]
    assert out.shape == (1,) and out.dtype == np.float32


def test_reduce_infers_unknown_batch_dim():
    program, op, _ = build("reduce_sum", {"X": randn(2, 3)}, {"dim": [1]}, batch_unknown=True)
    assert program.global_block().var(op.output("Out")[0]).shape == (-1,)


def test_sqrt_and_square_match_numpy_and_gradients():
    x = rng.uniform(0.5, 2.0, (3, 4))
    np.testing.assert_allclose(forward("sqrt", {"X": x})["Out"][0], np.sqrt(x))
    np.testing.assert_allclose(forward("square", {"X": x})["Out"][0], x * x)
    check_grad("sqrt", {"X": x})
    check_grad("square", {"X": x})


def test_sum_rejects_inputs_of_different_dtypes_when_built():
    with pytest.raises(ProgramError, match=r"building op 'sum' \(would be op 0 of block 0\): "
                                           r"inputs must have one dtype: X\[0\] is float32, "
                                           r"X\[1\] is float64"):
        build("sum", {"X": [np.zeros(2, np.float32), np.zeros(2)]})
