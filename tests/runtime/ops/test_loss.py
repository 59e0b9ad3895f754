"""softmax_with_cross_entropy: hard labels [N] or [N, 1], soft labels, ignore_index,
stability for large logits, gradient."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.errors import ExecutionError, ProgramError
from tests.runtime.gradcheck import build, check_grad, forward

rng = np.random.default_rng(9)


def _reference(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    log_softmax = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return np.exp(log_softmax), -log_softmax[np.arange(len(labels)), labels][:, None]


@pytest.mark.parametrize("label_shape", [(6,), (6, 1)])
def test_hard_labels_give_softmax_and_loss_n_by_1(label_shape):
    logits = rng.standard_normal((6, 4))
    labels = rng.integers(0, 4, 6)
    out = forward("softmax_with_cross_entropy",
                  {"Logits": logits, "Label": labels.reshape(label_shape)})
    softmax, loss = _reference(logits, labels)
    np.testing.assert_allclose(out["Softmax"][0], softmax, rtol=1e-12)
    np.testing.assert_allclose(out["Loss"][0], loss, rtol=1e-12)
    assert out["Loss"][0].shape == (6, 1)


@pytest.mark.parametrize("label_shape", [(5,), (5, 1)])
@pytest.mark.parametrize("classes", [2, 7])
def test_gradient_with_respect_to_logits(label_shape, classes):
    labels = rng.integers(0, classes, 5).reshape(label_shape)
    grads = check_grad("softmax_with_cross_entropy",
                       {"Logits": rng.standard_normal((5, classes)), "Label": labels})
    assert list(grads) == ["Logits"]


def test_large_logits_are_stable_in_float32():
    logits = np.array([[1000.0, 0.0, -1000.0], [5.0, 5.0, 5.0]], np.float32)
    out = forward("softmax_with_cross_entropy",
                  {"Logits": logits, "Label": np.array([[1], [2]], np.int64)})
    loss = out["Loss"][0]
    assert loss.dtype == np.float32 and out["Softmax"][0].dtype == np.float32
    np.testing.assert_allclose(loss, [[1000.0], [np.log(3.0)]], rtol=1e-6)


def test_ignored_rows_have_zero_loss_and_gradient():
    labels = np.array([1, -100, 0, 2])
    attrs = {"ignore_index": -100}
    logits = rng.standard_normal((4, 3))
    out = forward("softmax_with_cross_entropy", {"Logits": logits, "Label": labels}, attrs)
    assert out["Loss"][0][1, 0] == 0.0
    grads = check_grad("softmax_with_cross_entropy", {"Logits": logits, "Label": labels}, attrs)
    np.testing.assert_array_equal(grads["Logits"][0][1], 0.0)


def test_soft_labels_and_their_gradient():
    logits = rng.standard_normal((3, 4))
    labels = rng.dirichlet(np.ones(4), 3)
    attrs = {"soft_label": True}
    out = forward("softmax_with_cross_entropy", {"Logits": logits, "Label": labels}, attrs)
    log_softmax = np.log(_reference(logits, np.zeros(3, int))[0])
    np.testing.assert_allclose(out["Loss"][0], -(labels * log_softmax).sum(1, keepdims=True))
    check_grad("softmax_with_cross_entropy", {"Logits": logits, "Label": labels}, attrs,
               wrt=["Logits"])


def test_class_axis_other_than_last():
    logits = rng.standard_normal((3, 4, 2))
    labels = rng.integers(0, 4, (3, 1, 2))
    out = forward("softmax_with_cross_entropy", {"Logits": logits, "Label": labels},
                  {"axis": 1})
    z = logits - logits.max(axis=1, keepdims=True)
    log_sm = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(out["Loss"][0], -np.take_along_axis(log_sm, labels, 1))
    check_grad("softmax_with_cross_entropy", {"Logits": logits, "Label": labels}, {"axis": 1})


def test_out_of_range_label_is_an_execution_error_naming_it():
    with pytest.raises(ExecutionError, match="label 5 is out of range for 3 classes"):
        forward("softmax_with_cross_entropy",
                {"Logits": np.zeros((2, 3)), "Label": np.array([0, 5])})


def test_loss_shape_is_inferred_with_unknown_batch():
    program, op, _ = build("softmax_with_cross_entropy",
                           {"Logits": np.zeros((2, 3)), "Label": np.zeros((2, 1), np.int64)},
                           batch_unknown=True)
    block = program.global_block()
    assert block.var(op.output("Loss")[0]).shape == (-1, 1)
    assert block.var(op.output("Softmax")[0]).shape == (-1, 3)


@pytest.mark.parametrize("label, attrs, message", [
    (np.zeros(4, np.float32), {}, r"Label is float32\[4\]; with soft_label=False and Logits "
                                  r"\[4, 3\] it must be int64 \(or int32\) \[4, 1\] or \[4\]"),
    (np.zeros((4, 2), np.int64), {}, r"Label is int64\[4, 2\]"),
    (np.zeros((4, 2)), {"soft_label": True}, r"Label is float64\[4, 2\]; with soft_label=True "
                                             r"and Logits \[4, 3\] it must be float64\[4, 3\]"),
])
def test_label_of_the_wrong_dtype_or_shape_is_rejected_when_built(label, attrs, message):
    with pytest.raises(ProgramError, match=r"building op 'softmax_with_cross_entropy' \(would "
                                           r"be op 0 of block 0\): " + message):
        build("softmax_with_cross_entropy", {"Logits": np.zeros((4, 3)), "Label": label}, attrs)
