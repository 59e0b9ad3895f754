"""elementwise_add/sub/mul/div/max/min with Paddle broadcasting, and gradients reduced
over the broadcast dims."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ProgramError
from tests.runtime.gradcheck import build, check_grad, forward

rng = np.random.default_rng(3)

OPS = {
    "elementwise_add": np.add,
    "elementwise_sub": np.subtract,
    "elementwise_mul": np.multiply,
    "elementwise_div": np.divide,
    "elementwise_max": np.maximum,
    "elementwise_min": np.minimum,
}

# (X shape, Y shape, axis, Y reshaped for numpy)
SHAPES = [
    ((3, 4), (3, 4), -1, (3, 4)),
    ((3, 4), (4,), -1, (4,)),
    ((2, 3, 4), (3,), 1, (1, 3, 1)),
    ((2, 3, 4), (2, 3), 0, (2, 3, 1)),
    ((2, 1, 4), (3, 1), -1, (3, 1)),
    ((4,), (2, 4), -1, (2, 4)),
]


def _operands(xs, ys):
    x = rng.uniform(0.5, 2.0, xs) * rng.choice([-1, 1], xs)
    y = rng.uniform(0.5, 2.0, ys) * rng.choice([-1, 1], ys)
    return x, y


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("xs, ys, axis, y_np", SHAPES)
def test_elementwise_matches_numpy_broadcast(op, xs, ys, axis, y_np):
    x, y = _operands(xs, ys)
    (out,) = forward(op, {"X": x, "Y": y}, {"axis": axis})["Out"]
    np.testing.assert_allclose(out, OPS[op](x, y.reshape(y_np)), rtol=1e-12)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("xs, ys, axis, y_np", SHAPES)
def test_elementwise_gradients_sum_over_broadcast_dims(op, xs, ys, axis, y_np):
    x, y = _operands(xs, ys)
    check_grad(op, {"X": x, "Y": y}, {"axis": axis})


@pytest.mark.parametrize("op", OPS)
def test_elementwise_keeps_float32(op):
    x, y = (a.astype(np.float32) for a in _operands((2, 3), (3,)))
    (out,) = forward(op, {"X": x, "Y": y})["Out"]
    assert out.dtype == np.float32


def test_elementwise_add_infers_broadcast_shape_with_unknown_batch():
    program, op, _ = build("elementwise_add", {"X": np.zeros((2, 1, 4)), "Y": np.zeros((3, 1))},
                           batch_unknown=["X"])
    assert program.global_block().var(op.output("Out")[0]).shape == (-1, 3, 4)


def test_elementwise_rejects_shapes_that_do_not_broadcast():
    with pytest.raises(ProgramError, match="cannot be broadcast"):
        build("elementwise_mul", {"X": np.zeros((2, 3)), "Y": np.zeros((4,))})


def test_integer_division_truncates_toward_zero():
    x, y = np.array([7, -7], np.int64), np.array([2, 2], np.int64)
    (out,) = forward("elementwise_div", {"X": x, "Y": y})["Out"]
    assert out.dtype == np.int64 and out.tolist() == [3, -3]


def test_add_grad_with_two_same_shape_inputs_gives_distinct_arrays():
    # one of them may be dOut's own array; the other must be its own copy
    x, y = _operands((3, 2), (3, 2))
    grads = check_grad("elementwise_add", {"X": x, "Y": y})
    assert not np.shares_memory(grads["X"][0], grads["Y"][0])


def test_elementwise_rejects_inputs_of_different_dtypes_when_built():
    # numpy would promote to float64 while the program says float32
    with pytest.raises(ProgramError, match=r"building op 'elementwise_add' \(would be op 0 of "
                                           r"block 0\): inputs must have one dtype: X is "
                                           r"float32, Y is float64"):
        build("elementwise_add", {"X": np.zeros((2, 3), np.float32), "Y": np.zeros(3)})
