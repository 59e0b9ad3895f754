"""Output-buffer reuse never writes into an array the executor did not allocate, and
dropout masks do not depend on the ops a rewrite adds around the layer."""

from __future__ import annotations

import numpy as np

import ringflow as rf


def _relu_program():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 4], "float64")
        y = rf.nn.relu(x)
    return main, x, y


def test_array_assigned_by_the_user_is_not_overwritten_by_the_next_run():
    main, _, y = _relu_program()
    exe, scope = rf.Executor(), rf.Scope()
    feed = {"x": np.arange(8.0).reshape(2, 4)}
    exe.run(main, feed=feed, fetch_list=[y], scope=scope)
    mine = np.full((2, 4), 7.0)
    scope[y.name] = mine
    exe.run(main, feed=feed, fetch_list=[y], scope=scope)
    np.testing.assert_array_equal(mine, np.full((2, 4), 7.0))


def test_executor_reuses_its_own_output_array_across_runs():
    main, _, y = _relu_program()
    exe, scope = rf.Executor(), rf.Scope()
    feed = {"x": np.arange(8.0).reshape(2, 4)}
    exe.run(main, feed=feed, scope=scope)
    first = scope[y.name]
    exe.run(main, feed={"x": -np.arange(8.0).reshape(2, 4)}, scope=scope)
    assert scope[y.name] is first
    np.testing.assert_array_equal(first, np.zeros((2, 4)))


def _dropout_mask(extra_ops: int) -> np.ndarray:
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 64], "float64")
        h = x
        for _ in range(extra_ops):
            h = rf.nn.scale(h, 1.0)
        out = rf.nn.dropout(h, p=0.5)
    (value,) = rf.Executor().run(main, feed={"x": np.ones((4, 64))}, fetch_list=[out],
                                 scope=rf.Scope())
    return value != 0


def test_dropout_mask_is_the_same_whatever_ops_precede_the_layer():
    np.testing.assert_array_equal(_dropout_mask(0), _dropout_mask(3))
    assert 0.3 < _dropout_mask(0).mean() < 0.7
