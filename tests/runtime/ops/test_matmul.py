"""matmul_v2 (transposes, batches, broadcasting, 1-D operands) and mul."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ProgramError
from tests.runtime.gradcheck import build, check_grad, forward

rng = np.random.default_rng(11)

CASES = [  # X shape, Y shape, trans_x, trans_y
    ((3, 4), (4, 5), False, False),
    ((4, 3), (4, 5), True, False),
    ((3, 4), (5, 4), False, True),
    ((4, 3), (5, 4), True, True),
    ((2, 3, 4), (2, 4, 5), False, False),
    ((2, 3, 4), (4, 5), False, False),
    ((2, 4, 3), (5, 4), True, True),
    ((3, 4), (2, 4, 5), False, False),
    ((2, 1, 3, 4), (3, 4, 2), False, False),
    ((4,), (4, 5), False, False),
    ((2, 3, 4), (4,), False, False),
    ((4,), (4,), False, False),
]


def _numpy(x, y, tx, ty):
    if tx and x.ndim > 1:
        x = np.swapaxes(x, -1, -2)
    if ty and y.ndim > 1:
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


@pytest.mark.parametrize("xs, ys, tx, ty", CASES)
def test_matmul_v2_matches_numpy(xs, ys, tx, ty):
    x, y = rng.standard_normal(xs), rng.standard_normal(ys)
    (out,) = forward("matmul_v2", {"X": x, "Y": y}, {"trans_x": tx, "trans_y": ty})["Out"]
    np.testing.assert_allclose(out, np.reshape(_numpy(x, y, tx, ty), out.shape), rtol=1e-12)
    assert out.shape == (np.shape(_numpy(x, y, tx, ty)) or (1,)) or out.shape == ()


@pytest.mark.parametrize("xs, ys, tx, ty", CASES)
def test_matmul_v2_gradients(xs, ys, tx, ty):
    x, y = rng.standard_normal(xs), rng.standard_normal(ys)
    check_grad("matmul_v2", {"X": x, "Y": y}, {"trans_x": tx, "trans_y": ty})


def test_matmul_v2_keeps_float32_and_infers_batch():
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.standard_normal((4, 3)).astype(np.float32)
    (out,) = forward("matmul_v2", {"X": x, "Y": y})["Out"]
    assert out.dtype == np.float32
    program, op, _ = build("matmul_v2", {"X": x, "Y": y}, batch_unknown=True)
    assert program.global_block().var(op.output("Out")[0]).shape == (-1, 3)


def test_matmul_v2_rejects_mismatched_inner_dims():
    with pytest.raises(ProgramError, match="contracted dims differ"):
        build("matmul_v2", {"X": np.zeros((2, 3)), "Y": np.zeros((4, 5))})


def test_mul_flattens_to_matrices():
    x, y = rng.standard_normal((2, 3, 4)), rng.standard_normal((12, 5))
    (out,) = forward("mul", {"X": x, "Y": y}, {"x_num_col_dims": 1})["Out"]
    np.testing.assert_allclose(out, x.reshape(2, 12) @ y, rtol=1e-12)
    check_grad("mul", {"X": x, "Y": y})
    check_grad("mul", {"X": x, "Y": rng.standard_normal((4, 5))}, {"x_num_col_dims": 2})


@pytest.mark.parametrize("op", ["matmul_v2", "mul"])
def test_matmul_rejects_inputs_of_different_dtypes_when_built(op):
    with pytest.raises(ProgramError, match="inputs must have one dtype: X is float64, Y is "
                                           "float32"):
        build(op, {"X": np.zeros((2, 3)), "Y": np.zeros((3, 4), np.float32)})
