"""softmax, layer_norm, dropout, lookup_table_v2."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ExecutionError, ProgramError
from tests.runtime.gradcheck import build, check_grad, forward, run_program

rng = np.random.default_rng(13)


@pytest.mark.parametrize("shape, axis", [((4, 5), -1), ((2, 3, 4), 1), ((3,), 0)])
def test_softmax_matches_formula_and_gradient(shape, axis):
    x = rng.standard_normal(shape)
    (out,) = forward("softmax", {"X": x}, {"axis": axis})["Out"]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=axis, keepdims=True), rtol=1e-12)
    check_grad("softmax", {"X": x}, {"axis": axis})


def test_softmax_is_stable_for_large_float32_inputs():
    (out,) = forward("softmax", {"X": np.array([[1e4, 0.0]], np.float32)})["Out"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1.0, 0.0]])


def _layer_norm_reference(x, scale, bias, begin, eps):
    axes = tuple(range(begin, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    right = x.shape[begin:]
    if scale is not None:
        y = y * scale.reshape(right)
    if bias is not None:
        y = y + bias.reshape(right)
    return y, mean.reshape(-1), var.reshape(-1)


@pytest.mark.parametrize("shape, begin", [((4, 6), 1), ((2, 3, 4), 2), ((2, 3, 4), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_formula_and_gradients(shape, begin, affine):
    x = rng.standard_normal(shape) * 3 + 1
    right = int(np.prod(shape[begin:]))
    inputs = {"X": x}
    scale = bias = None
    if affine:
        scale, bias = rng.standard_normal(right), rng.standard_normal(right)
        inputs.update(Scale=scale, Bias=bias)
    attrs = {"begin_norm_axis": begin, "epsilon": 1e-5}
    out = forward("layer_norm", inputs, attrs)
    y, mean, var = _layer_norm_reference(x, scale, bias, begin, 1e-5)
    np.testing.assert_allclose(out["Y"][0], y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["Mean"][0], mean, rtol=1e-12)
    np.testing.assert_allclose(out["Variance"][0], var, rtol=1e-12)
    check_grad("layer_norm", inputs, attrs)


def test_layer_norm_keeps_float32():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    out = forward("layer_norm", {"X": x, "Scale": np.ones(4, np.float32)})
    assert out["Y"][0].dtype == np.float32 and out["Variance"][0].dtype == np.float32


def _dropout(x, **attrs):
    return forward("dropout", {"X": x}, {"seed": 7, **attrs})


def test_dropout_upscale_keeps_scaled_elements_where_mask_is_set():
    x = rng.standard_normal((50, 40))
    out = _dropout(x, dropout_prob=0.3)
    mask = out["Mask"][0]
    assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    np.testing.assert_allclose(out["Out"][0], x * mask / 0.7, rtol=1e-12)
    assert abs(mask.mean() - 0.7) < 0.05


def test_dropout_downgrade_in_infer_does_not_scale_in_training():
    x = rng.standard_normal((10, 10))
    out = _dropout(x, dropout_prob=0.3, dropout_implementation="downgrade_in_infer")
    np.testing.assert_array_equal(out["Out"][0], x * out["Mask"][0])


@pytest.mark.parametrize("mode, factor", [("upscale_in_train", 1.0), ("downgrade_in_infer", 0.6)])
def test_dropout_in_test_mode_is_deterministic_and_makes_no_mask(mode, factor):
    x = rng.standard_normal((4, 4))
    attrs = {"dropout_prob": 0.4, "is_test": True, "dropout_implementation": mode}
    program, op, feed = build("dropout", {"X": x}, attrs)
    (out,) = run_program(program, feed, op.output("Out"))
    np.testing.assert_allclose(out, x * factor, rtol=1e-12)
    with pytest.raises(ExecutionError, match="was not computed"):
        run_program(program, feed, op.output("Mask"))


def test_dropout_is_the_same_for_the_same_seed_and_differs_across_steps():
    from ringflow.executor import Executor, Scope

    program, op, feed = build("dropout", {"X": np.ones((64,))}, {"dropout_prob": 0.5, "seed": 3})
    exe, scope = Executor(), Scope()
    first = exe.run(program, feed=feed, fetch_list=op.output("Mask"), scope=scope)[0]
    second = exe.run(program, feed=feed, fetch_list=op.output("Mask"), scope=scope)[0]
    again = Executor().run(program, feed=feed, fetch_list=op.output("Mask"), scope=Scope())[0]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("mode", ["upscale_in_train", "downgrade_in_infer"])
def test_dropout_gradient_is_masked(mode):
    check_grad("dropout", {"X": rng.standard_normal((6, 5))},
               {"dropout_prob": 0.4, "seed": 5, "dropout_implementation": mode})


def test_dropout_rejects_probability_above_one():
    with pytest.raises(ExecutionError, match=r"dropout_prob must be in \[0, 1\]"):
        _dropout(np.ones(3), dropout_prob=1.5)


def test_lookup_table_gathers_rows_and_zeroes_padding():
    w = rng.standard_normal((6, 3))
    ids = np.array([[0, 5, 2], [2, 2, 1]], np.int64)
    (out,) = forward("lookup_table_v2", {"W": w, "Ids": ids}, {"padding_idx": 2})["Out"]
    expected = w[ids]
    expected[ids == 2] = 0
    np.testing.assert_array_equal(out, expected)
    assert out.shape == (2, 3, 3)


@pytest.mark.parametrize("padding_idx", [-1, 1])
def test_lookup_table_gradient_accumulates_repeated_ids(padding_idx):
    ids = np.array([[0, 1, 1], [3, 1, 0]], np.int64)
    grads = check_grad("lookup_table_v2", {"W": rng.standard_normal((5, 2)), "Ids": ids},
                       {"padding_idx": padding_idx})
    assert list(grads) == ["W"]
    np.testing.assert_array_equal(grads["W"][0][4], 0.0)   # id 4 unused


def test_lookup_table_rejects_out_of_range_ids():
    with pytest.raises(ExecutionError, match="id 9 is out of range for a table of 4 rows"):
        forward("lookup_table_v2", {"W": np.zeros((4, 2)), "Ids": np.array([1, 9])})


def test_lookup_table_rejects_float_ids_when_built():
    with pytest.raises(ProgramError, match=r"building op 'lookup_table_v2' .*Ids must be "
                                           r"integers \(int64\), got float32"):
        build("lookup_table_v2", {"W": np.zeros((5, 2)), "Ids": np.zeros(3, np.float32)})
