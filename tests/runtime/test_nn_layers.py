"""ringflow.nn layer functions: the ops and parameters they create, inferred shapes, and
the values they compute after the startup program ran."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ProgramError

rng = np.random.default_rng(21)


@pytest.fixture
def programs():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        yield main, startup


def _run(main, startup, feed, fetch):
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope), scope


def _op_types(main):
    return [op.type for op in main.global_block().ops]


def test_fc_is_matmul_plus_bias_with_weight_in_by_out(programs):
    main, startup = programs
    x = rf.data("x", [-1, 4])
    y = rf.nn.fc(x, 3, activation="relu")
    assert _op_types(main) == ["matmul_v2", "elementwise_add", "relu"]
    assert (y.shape, y.dtype) == ((-1, 3), "float32")
    w, b = main.all_parameters()
    assert (w.shape, b.shape) == ((4, 3), (3,))
    xb = rng.standard_normal((5, 4)).astype(np.float32)
    (out,), scope = _run(main, startup, {"x": xb}, [y])
    expected = np.maximum(xb @ scope[w.name] + scope[b.name], 0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_fc_without_bias_and_with_float64_input(programs):
    main, _ = programs
    x = rf.data("x", [-1, 2, 5], dtype="float64")
    y = rf.nn.fc(x, 6, bias_attr=False, name="proj")
    assert _op_types(main) == ["matmul_v2"]
    (w,) = main.all_parameters()
    assert (w.name, w.shape, w.dtype) == ("proj.w_0", (5, 6), "float64")
    assert (y.shape, y.dtype) == ((-1, 2, 6), "float64")


def test_fc_rejects_unknown_activation(programs):
    with pytest.raises(ProgramError, match="unknown activation 'swish'"):
        rf.nn.fc(rf.data("x", [-1, 4]), 3, activation="swish")


def test_embedding_looks_up_rows_and_zeroes_padding(programs):
    main, startup = programs
    ids = rf.data("ids", [-1, 3], dtype="int64")
    emb = rf.nn.embedding(ids, size=(10, 4), padding_idx=-1)
    assert emb.shape == (-1, 3, 4)
    assert main.global_block().ops[0].attr("padding_idx") == 9
    idb = np.array([[1, 9, 3]], np.int64)
    (out,), scope = _run(main, startup, {"ids": idb}, [emb])
    table = scope[main.all_parameters()[0].name]
    np.testing.assert_array_equal(out[0, [0, 2]], table[[1, 3]])
    np.testing.assert_array_equal(out[0, 1], 0.0)


def test_layer_norm_starts_as_plain_normalisation(programs):
    main, startup = programs
    x = rf.data("x", [-1, 6])
    y = rf.nn.layer_norm(x)
    scale, bias = main.all_parameters()
    assert (scale.shape, bias.shape) == ((6,), (6,))
    xb = rng.standard_normal((3, 6)).astype(np.float32)
    (out,), _ = _run(main, startup, {"x": xb}, [y])
    expected = (xb - xb.mean(1, keepdims=True)) / np.sqrt(xb.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    op = main.global_block().ops[0]
    assert main.global_block().var(op.output("Mean")[0]).stop_gradient


def test_dropout_masks_in_training_and_is_identity_in_a_test_clone(programs):
    main, startup = programs
    x = rf.data("x", [-1, 100])
    y = rf.nn.dropout(x, p=0.5)
    xb = np.ones((4, 100), np.float32)
    (out,), _ = _run(main, startup, {"x": xb}, [y])
    assert set(np.unique(out)) == {0.0, 2.0}
    test_program = main.clone(for_test=True)
    (out,), _ = _run(test_program, startup, {"x": xb}, [y.name])
    np.testing.assert_array_equal(out, xb)


def test_dropout_seed_is_fixed_by_the_layer(programs):
    main, _ = programs
    rf.nn.dropout(rf.data("x", [-1, 4]), p=0.1)
    rf.nn.dropout(rf.data("z", [-1, 4]), p=0.1, seed=42)
    first, second = main.global_block().ops
    assert first.attr("seed") != 0 and not first.attr("fix_seed")
    assert second.attr("seed") == 42 and second.attr("fix_seed")


def test_loss_layers_shapes(programs):
    logits = rf.data("logits", [-1, 5])
    label = rf.data("label", [-1, 1], dtype="int64")
    loss = rf.nn.softmax_with_cross_entropy(logits, label)
    assert loss.shape == (-1, 1)
    avg = rf.nn.mean(loss)
    assert avg.shape == (1,)
    assert rf.nn.cross_entropy(logits, label).shape == (1,)


def test_mean_of_cross_entropy_matches_numpy(programs):
    main, startup = programs
    logits = rf.data("logits", [-1, 3], dtype="float64")
    label = rf.data("label", [-1], dtype="int64")
    avg = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, label))
    lb, yb = rng.standard_normal((4, 3)), np.array([0, 2, 1, 2])
    (out,), _ = _run(main, startup, {"logits": lb, "label": yb}, [avg])
    log_sm = lb - np.log(np.exp(lb).sum(1, keepdims=True))
    np.testing.assert_allclose(out, [-log_sm[np.arange(4), yb].mean()], rtol=1e-12)


def test_shape_layers_infer_shapes(programs):
    x = rf.data("x", [-1, 4, 6])
    assert rf.nn.reshape(x, [0, -1]).shape == (-1, 24)
    assert rf.nn.transpose(x, [0, 2, 1]).shape == (-1, 6, 4)
    assert rf.nn.concat([x, x], axis=2).shape == (-1, 4, 12)
    assert [p.shape for p in rf.nn.split(x, [1, -1], axis=1)] == [(-1, 1, 6), (-1, 3, 6)]
    assert [p.shape for p in rf.nn.split(x, 3, axis=2)] == [(-1, 4, 2)] * 3
    assert rf.nn.slice(x, [2], [1], [3]).shape == (-1, 4, 2)
    assert rf.nn.unsqueeze(x, [1]).shape == (-1, 1, 4, 6)
    assert rf.nn.matmul(x, x, transpose_y=True).shape == (-1, 4, 4)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


FUNCTIONAL = {   # layer -> (op type, numpy formula on positive inputs)
    "relu": ("relu", lambda x: np.maximum(x, 0)),
    "gelu": ("gelu", _gelu),
    "tanh": ("tanh", np.tanh),
    "sigmoid": ("sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    "softmax": ("softmax", _softmax),
    "exp": ("exp", np.exp),
    "log": ("log", np.log),
    "sqrt": ("sqrt", np.sqrt),
    "square": ("square", np.square),
}


@pytest.mark.parametrize("layer", FUNCTIONAL)
def test_functional_layer_appends_its_one_op_and_computes_it(programs, layer):
    main, startup = programs
    op_type, formula = FUNCTIONAL[layer]
    x = rf.data("x", [-1, 3], dtype="float64")
    out = getattr(rf.nn, layer)(x)
    assert _op_types(main) == [op_type] and out.shape == (-1, 3)
    xb = rng.uniform(0.1, 2.0, (2, 3))
    (got,), _ = _run(main, startup, {"x": xb}, [out])
    np.testing.assert_allclose(got, formula(xb), rtol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh", "sigmoid", "softmax"])
def test_fc_activation_is_applied_to_x_w_plus_b(programs, activation):
    main, startup = programs
    x = rf.data("x", [-1, 3], dtype="float64")
    y = rf.nn.fc(x, 2, activation=activation)
    assert _op_types(main) == ["matmul_v2", "elementwise_add", activation]
    xb = rng.standard_normal((4, 3))
    (got,), scope = _run(main, startup, {"x": xb}, [y])
    pre = xb @ scope["fc_0.w_0"] + scope["fc_0.b_0"]
    np.testing.assert_allclose(got, FUNCTIONAL[activation][1](pre), rtol=1e-12)


def test_elementwise_helpers_compute_with_broadcast(programs):
    main, startup = programs
    x = rf.data("x", [-1, 3], dtype="float64")
    y = rf.data("y", [3], dtype="float64")
    outs = [rf.nn.add(x, y), rf.nn.subtract(x, y), rf.nn.multiply(x, y), rf.nn.divide(x, y),
            rf.nn.scale(x, 2.0, bias=1.0)]
    xb, yb = rng.standard_normal((2, 3)), rng.uniform(1, 2, 3)
    got, _ = _run(main, startup, {"x": xb, "y": yb}, outs)
    for g, e in zip(got, [xb + yb, xb - yb, xb * yb, xb / yb, 2 * xb + 1]):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_fc_gradients_through_append_backward_match_numpy(programs):
    main, startup = programs
    x = rf.data("x", [-1, 3], dtype="float64")
    label = rf.data("label", [-1], dtype="int64")
    logits = rf.nn.fc(x, 4)
    loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, label))
    (w, gw), (b, gb) = rf.append_backward(loss)
    xb, yb = rng.standard_normal((5, 3)), np.array([0, 3, 1, 1, 2])
    (gw_v, gb_v), scope = _run(main, startup, {"x": xb, "label": yb}, [gw, gb])
    z = xb @ scope[w.name] + scope[b.name]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(5), yb] -= 1
    np.testing.assert_allclose(gw_v, xb.T @ p / 5, rtol=1e-10)
    np.testing.assert_allclose(gb_v, p.sum(0) / 5, rtol=1e-10)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_reductions_skip_ignored_rows(programs, reduction):
    main, startup = programs
    logits = rf.data("logits", [-1, 3], dtype="float64")
    label = rf.data("label", [-1, 1], dtype="int64")
    out = rf.nn.cross_entropy(logits, label, ignore_index=-1, reduction=reduction)
    lb, yb = rng.standard_normal((4, 3)), np.array([[0], [-1], [2], [1]])
    (got,), _ = _run(main, startup, {"logits": lb, "label": yb}, [out])
    log_sm = lb - np.log(np.exp(lb).sum(1, keepdims=True))
    rows = -log_sm[[0, 2, 3], yb[[0, 2, 3], 0]]
    expected = {"mean": [rows.mean()], "sum": [rows.sum()],
                "none": np.insert(rows, 1, 0.0)[:, None]}[reduction]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_cross_entropy_mean_gradient_divides_by_kept_rows(programs):
    main, startup = programs
    logits = rf.data("logits", [-1, 3], dtype="float64")
    logits.stop_gradient = False
    label = rf.data("label", [-1], dtype="int64")
    loss = rf.nn.cross_entropy(logits, label, ignore_index=-1)
    (grad,) = rf.gradients([loss], [logits])
    lb, yb = rng.standard_normal((3, 3)), np.array([2, -1, 0])
    (got,), _ = _run(main, startup, {"logits": lb, "label": yb}, [grad])
    p = np.exp(lb) / np.exp(lb).sum(1, keepdims=True)
    p[[0, 2], [2, 0]] -= 1
    p[1] = 0
    np.testing.assert_allclose(got, p / 2, rtol=1e-10)


@pytest.mark.parametrize("layer", ["fc", "layer_norm"])
def test_layers_with_parameters_reject_an_integer_input(programs, layer):
    ids = rf.data("ids", [-1, 3], "int64")
    with pytest.raises(ProgramError, match=f"{layer}: input 'ids' is int64; {layer} needs a "
                                           f"float input"):
        rf.nn.fc(ids, 4) if layer == "fc" else rf.nn.layer_norm(ids)
