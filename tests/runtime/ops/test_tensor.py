"""reshape2, transpose2, squeeze2, unsqueeze2, concat, split, slice."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ProgramError
from tests.runtime.gradcheck import build, check_grad, forward

rng = np.random.default_rng(17)


@pytest.mark.parametrize("shape_attr, expected", [
    ([4, 6], (4, 6)), ([0, -1], (2, 12)), ([-1, 3, 2], (4, 3, 2)), ([0, 0, 2, 2], (2, 3, 2, 2)),
])
def test_reshape2_copies_zero_dims_and_infers_minus_one(shape_attr, expected):
    x = rng.standard_normal((2, 3, 4))
    out = forward("reshape2", {"X": x}, {"shape": shape_attr}, outputs=["Out", "XShape"])
    np.testing.assert_array_equal(out["Out"][0], x.reshape(expected))
    assert out["XShape"][0].shape == (0, 2, 3, 4)
    check_grad("reshape2", {"X": x}, {"shape": shape_attr}, outputs=["Out", "XShape"])


def test_reshape2_gradient_without_xshape_reads_x():
    check_grad("reshape2", {"X": rng.standard_normal((2, 3))}, {"shape": [3, 2]})


def test_reshape2_keeps_the_unknown_batch_dim():
    program, op, _ = build("reshape2", {"X": np.zeros((2, 3, 4))}, {"shape": [0, -1]},
                           batch_unknown=True)
    assert program.global_block().var(op.output("Out")[0]).shape == (-1, 12)


def test_reshape2_rejects_incompatible_shape():
    with pytest.raises(ProgramError, match="cannot reshape"):
        build("reshape2", {"X": np.zeros((2, 3))}, {"shape": [4, -1]})


@pytest.mark.parametrize("axis", [[1, 0], [0, 2, 1], [2, 0, 1]])
def test_transpose2_permutes_and_gradient_permutes_back(axis):
    x = rng.standard_normal((2, 3, 4)[: len(axis)])
    out = forward("transpose2", {"X": x}, {"axis": axis}, outputs=["Out", "XShape"])
    np.testing.assert_array_equal(out["Out"][0], np.transpose(x, axis))
    check_grad("transpose2", {"X": x}, {"axis": axis}, outputs=["Out", "XShape"])


def test_transpose2_rejects_a_non_permutation():
    with pytest.raises(ProgramError, match="not a permutation"):
        build("transpose2", {"X": np.zeros((2, 3))}, {"axis": [0, 0]})


@pytest.mark.parametrize("op, axes, shape, expected", [
    ("squeeze2", [1], (2, 1, 3, 1), (2, 3, 1)),
    ("squeeze2", [], (2, 1, 3, 1), (2, 3)),
    ("squeeze2", [0], (2, 1, 3), (2, 1, 3)),
    ("unsqueeze2", [0, 2], (2, 3), (1, 2, 1, 3)),
    ("unsqueeze2", [-1], (2, 3), (2, 3, 1)),
])
def test_squeeze_and_unsqueeze_shapes_and_gradients(op, axes, shape, expected):
    x = rng.standard_normal(shape)
    (out,) = forward(op, {"X": x}, {"axes": axes})["Out"]
    np.testing.assert_array_equal(out, x.reshape(expected))
    check_grad(op, {"X": x}, {"axes": axes})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_joins_along_axis_and_splits_gradient(axis):
    xs = [rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 3))]
    (out,) = forward("concat", {"X": xs}, {"axis": axis})["Out"]
    np.testing.assert_array_equal(out, np.concatenate(xs, axis=axis))
    check_grad("concat", {"X": xs}, {"axis": axis})


def test_concat_infers_unknown_dim_and_rejects_mismatch():
    program, op, _ = build("concat", {"X": [np.zeros((2, 3)), np.zeros((2, 5))]}, {"axis": 1},
                           batch_unknown=True)
    assert program.global_block().var(op.output("Out")[0]).shape == (-1, 8)
    with pytest.raises(ProgramError, match="differ outside axis 1"):
        build("concat", {"X": [np.zeros((2, 3)), np.zeros((4, 5))]}, {"axis": 1})


@pytest.mark.parametrize("attrs, sizes", [
    ({"num": 3, "axis": 1}, [2, 2, 2]),
    ({"sections": [1, 3, 2], "axis": 1}, [1, 3, 2]),
    ({"sections": [1, -1], "axis": 0}, [1, 3]),
])
def test_split_cuts_along_axis_and_gradient_joins(attrs, sizes):
    x = rng.standard_normal((4, 6))
    outs = forward("split", {"X": x}, attrs, outputs={"Out": len(sizes)})["Out"]
    expected = np.split(x, np.cumsum(sizes)[:-1], axis=attrs["axis"])
    for got, want in zip(outs, expected):
        np.testing.assert_array_equal(got, want)
    check_grad("split", {"X": x}, attrs, outputs={"Out": len(sizes)})


def test_split_rejects_uneven_num():
    with pytest.raises(ProgramError, match="does not split into 4 equal pieces"):
        build("split", {"X": np.zeros((6,))}, {"num": 4}, outputs={"Out": 4})


@pytest.mark.parametrize("attrs, index", [
    ({"axes": [0], "starts": [1], "ends": [3]}, np.s_[1:3]),
    ({"axes": [1, 2], "starts": [-2, 0], "ends": [100, 2]}, np.s_[:, -2:, 0:2]),
    ({"axes": [0], "starts": [1], "ends": [2], "decrease_axis": [0]}, np.s_[1]),
])
def test_slice_matches_python_slicing_and_gradient(attrs, index):
    x = rng.standard_normal((4, 3, 5))
    (out,) = forward("slice", {"Input": x}, attrs)["Out"]
    np.testing.assert_array_equal(out, x[index])
    check_grad("slice", {"Input": x}, attrs)


def test_slice_keeps_unknown_batch_dim():
    program, op, _ = build("slice", {"Input": np.zeros((4, 6))},
                           {"axes": [1], "starts": [2], "ends": [5]}, batch_unknown=True)
    assert program.global_block().var(op.output("Out")[0]).shape == (-1, 3)


def test_concat_rejects_inputs_of_different_dtypes_when_built():
    with pytest.raises(ProgramError, match=r"inputs must have one dtype: X\[0\] is float64, "
                                           r"X\[1\] is int64"):
        build("concat", {"X": [np.zeros((2, 1)), np.zeros((2, 1), np.int64)]}, {"axis": 1})


@pytest.mark.parametrize("diagonal, lower", [(0, True), (-1, True), (1, False), (0, False)])
def test_tril_triu_keeps_one_triangle_of_the_last_two_dims(diagonal, lower):
    x = rng.standard_normal((2, 4, 5))
    out = forward("tril_triu", {"X": x}, {"diagonal": diagonal, "lower": lower})["Out"][0]
    expected = np.tril(x, diagonal) if lower else np.triu(x, diagonal)
    np.testing.assert_array_equal(out, expected)
    check_grad("tril_triu", {"X": x}, {"diagonal": diagonal, "lower": lower})
