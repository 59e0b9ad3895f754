"""The numpy executor: running, feeding, fetching, and the errors it reports."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ExecutionError, ProgramError
from ringflow.framework.registry import _unregister_op


def _scale_add_program():
    """out = 2 * x + w, with x data [-1, 3] float32 and w a parameter [1, 3]."""
    prog = rf.Program()
    block = prog.global_block()
    block.create_var(name="x", shape=[-1, 3], dtype="float32", is_data=True, stop_gradient=True)
    block.create_parameter("w", shape=[1, 3], dtype="float32")
    block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "h"}, attrs={"scale": 2.0})
    block.append_op("rft_add", inputs={"X": "h", "Y": "w"}, outputs={"Out": "out"})
    return prog


def test_run_computes_fetches_from_feeds_and_scope(scratch_ops):
    prog, scope = _scale_add_program(), rf.Scope()
    scope["w"] = np.array([[1, 2, 3]], np.float32)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    h_var = prog.global_block().var("h")
    out, h = rf.Executor().run(prog, feed={"x": x}, fetch_list=["out", h_var], scope=scope)
    np.testing.assert_array_equal(out, 2 * x + [[1, 2, 3]])
    np.testing.assert_array_equal(h, 2 * x)
    assert out.dtype == np.float32


def test_run_defaults_to_default_main_program_and_global_scope(scratch_ops):
    block = rf.default_main_program().global_block()
    block.create_var(name="x", shape=[2], dtype="float64", is_data=True)
    block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "y"}, attrs={"scale": 3.0})
    (y,) = rf.Executor().run(feed={"x": np.ones(2)}, fetch_list=["y"])
    np.testing.assert_array_equal(y, [3.0, 3.0])
    np.testing.assert_array_equal(rf.global_scope()["y"], [3.0, 3.0])


def test_python_list_feed_is_converted_to_the_variable_dtype(scratch_ops):
    prog, scope = _scale_add_program(), rf.Scope()
    scope["w"] = np.zeros((1, 3), np.float32)
    (out,) = rf.Executor().run(prog, feed={"x": [[1, 2, 3]]}, fetch_list=["out"], scope=scope)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[2, 4, 6]])


def test_missing_feed_names_the_data_variable(scratch_ops):
    scope = rf.Scope()
    scope["w"] = np.zeros((1, 3), np.float32)
    with pytest.raises(ExecutionError, match=r"op 0 \(rft_scale\): data variable 'x' is not fed"):
        rf.Executor().run(_scale_add_program(), scope=scope)


def test_uninitialised_parameter_says_to_run_the_startup_program(scratch_ops):
    with pytest.raises(ExecutionError, match=r"op 1 \(rft_add\): persistable variable 'w' has "
                                             r"no value: run the startup program"):
        rf.Executor().run(_scale_add_program(), feed={"x": np.zeros((1, 3), np.float32)},
                          scope=rf.Scope())


def test_fed_array_of_wrong_shape_names_expected_and_given_shape(scratch_ops):
    with pytest.raises(ExecutionError, match=r"feed 'x': expected shape \[-1, 3\] \(-1 = any\), "
                                             r"got \[2, 4\]"):
        rf.Executor().run(_scale_add_program(), feed={"x": np.zeros((2, 4), np.float32)},
                          scope=rf.Scope())


def test_fed_array_of_wrong_rank_is_rejected(scratch_ops):
    with pytest.raises(ExecutionError, match=r"expected shape \[-1, 3\] \(-1 = any\), got \[3\]"):
        rf.Executor().run(_scale_add_program(), feed={"x": np.zeros(3, np.float32)},
                          scope=rf.Scope())


def test_fed_array_of_wrong_dtype_names_expected_and_given_dtype(scratch_ops):
    with pytest.raises(ExecutionError, match="feed 'x': expected dtype float32, got int64"):
        rf.Executor().run(_scale_add_program(), feed={"x": np.zeros((2, 3), np.int64)},
                          scope=rf.Scope())


def test_feed_of_unknown_variable_and_unknown_fetch_are_rejected(scratch_ops):
    prog = _scale_add_program()
    with pytest.raises(ExecutionError, match="feed 'y' is not a variable of the program"):
        rf.Executor().run(prog, feed={"y": np.zeros(1)}, scope=rf.Scope())
    with pytest.raises(ExecutionError, match="fetch target 'nope' is not a variable"):
        rf.Executor().run(prog, fetch_list=["nope"], scope=rf.Scope())


def test_parameter_set_by_hand_with_another_dtype_is_rejected_before_any_op(scratch_ops):
    prog, scope = _scale_add_program(), rf.Scope()
    scope["w"] = np.zeros((1, 3))                     # float64, the program says float32
    with pytest.raises(ExecutionError, match=r"persistable variable 'w' is float64\[1, 3\] in "
                                             r"the scope, the program declares float32\[1, 3\]"):
        rf.Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)}, scope=scope)
    assert "h" not in scope
    scope["w"] = np.zeros((1, 3), np.float32)
    out, = rf.Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)},
                             fetch_list=["out"], scope=scope)
    assert out.dtype == np.float32 and out.tolist() == [[2.0, 2.0, 2.0]]


def test_program_that_writes_a_persistable_first_may_replace_any_old_value(scratch_ops):
    # a startup program initialising "w" over a stale float64 value of another model
    prog, scope = rf.Program(), rf.Scope()
    block = prog.global_block()
    block.create_var(name="w", shape=[2], dtype="float32", persistable=True)
    block.append_op("rft_fill", outputs={"Out": "w"},
                    attrs={"shape": [2], "value": 1.5, "dtype": "float32"})
    scope["w"] = np.zeros(5)
    rf.Executor().run(prog, scope=scope)
    assert scope["w"].dtype == np.float32 and scope["w"].tolist() == [1.5, 1.5]


def test_fetch_of_a_variable_no_op_computed_is_rejected(scratch_ops):
    prog = _scale_add_program()
    prog.global_block().create_var(name="never", shape=[1])
    scope = rf.Scope()
    scope["w"] = np.zeros((1, 3), np.float32)
    with pytest.raises(ExecutionError, match="fetch target 'never' was not computed"):
        rf.Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)},
                          fetch_list=["out", "never"], scope=scope)


def test_op_type_unregistered_after_build_fails_the_run_before_any_op_runs(scratch_ops):
    prog, scope = _scale_add_program(), rf.Scope()
    scope["w"] = np.zeros((1, 3), np.float32)
    _unregister_op("rft_add")
    with pytest.raises(ProgramError, match=r"op 1 \(rft_add\): unknown op type 'rft_add'"):
        rf.Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)}, scope=scope)
    assert "h" not in scope


def test_kernel_exception_is_reported_with_op_index_and_type(scratch_ops):
    block = (prog := rf.Program()).global_block()
    block.create_var(name="a", shape=[2], dtype="float64", is_data=True)
    block.append_op("rft_concat", inputs={"X": ["a", "a"]}, outputs={"Out": "c"},
                    attrs={"axis": 3})
    with pytest.raises(ExecutionError, match=r"op 0 \(rft_concat\) failed: AxisError"):
        rf.Executor().run(prog, feed={"a": np.ones(2)}, scope=rf.Scope())


def _log_program():
    prog = rf.Program()
    block = prog.global_block()
    block.create_var(name="x", shape=[2], dtype="float64", is_data=True)
    block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "h"}, attrs={"scale": -1.0})
    block.append_op("rft_log", inputs={"X": "h"}, outputs={"Out": "y"})
    return prog


def test_nan_is_reported_with_the_op_that_produced_it_when_checking(scratch_ops, monkeypatch):
    monkeypatch.setenv("RINGFLOW_CHECK_NAN", "1")
    with pytest.raises(ExecutionError, match=r"op 1 \(rft_log\) produced NaN in output "
                                             r"Out='y' \(RINGFLOW_CHECK_NAN=1\)"), \
            np.errstate(invalid="ignore"):
        rf.Executor().run(_log_program(), feed={"x": np.array([1.0, 2.0])}, scope=rf.Scope())


def test_inf_is_reported_when_checking(scratch_ops, monkeypatch):
    monkeypatch.setenv("RINGFLOW_CHECK_NAN", "1")
    with pytest.raises(ExecutionError, match=r"op 1 \(rft_log\) produced inf"), \
            np.errstate(divide="ignore"):
        rf.Executor().run(_log_program(), feed={"x": np.array([0.0, -1.0])}, scope=rf.Scope())


def test_nan_passes_silently_without_the_check(scratch_ops, monkeypatch):
    monkeypatch.delenv("RINGFLOW_CHECK_NAN", raising=False)
    with np.errstate(invalid="ignore"):
        (y,) = rf.Executor().run(_log_program(), feed={"x": np.array([1.0, -np.e])},
                                 fetch_list=["y"], scope=rf.Scope())
    assert np.isnan(y[0]) and y[1] == pytest.approx(1.0)


def test_buffer_is_reused_across_runs_and_fetches_are_copies(scratch_ops):
    prog, scope, exe = rf.Program(), rf.Scope(), rf.Executor()
    block = prog.global_block()
    block.create_var(name="x", shape=[-1], dtype="float64", is_data=True)
    block.append_op("rft_copy", inputs={"X": "x"}, outputs={"Out": "y"})
    (first,) = exe.run(prog, feed={"x": np.ones(3)}, fetch_list=["y"], scope=scope)
    buf = scope["y"]
    exe.run(prog, feed={"x": np.full(3, 2.0)}, scope=scope)
    assert scope["y"] is buf
    np.testing.assert_array_equal(buf, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(first, [1.0, 1.0, 1.0])
    exe.run(prog, feed={"x": np.ones(4)}, scope=scope)
    assert scope["y"] is not buf and scope["y"].shape == (4,)


def test_buffer_never_writes_into_an_array_the_user_put_in_the_scope(scratch_ops):
    prog, scope = rf.Program(), rf.Scope()
    block = prog.global_block()
    block.create_var(name="x", shape=[3], dtype="float64", is_data=True)
    block.append_op("rft_copy", inputs={"X": "x"}, outputs={"Out": "y"})
    mine = np.zeros(3)
    scope["y"] = mine
    rf.Executor().run(prog, feed={"x": np.ones(3)}, scope=scope)
    np.testing.assert_array_equal(mine, [0.0, 0.0, 0.0])


def _rand_program(seed_attr, ops_before=0):
    prog = rf.Program()
    prog.random_seed = 11
    block = prog.global_block()
    for i in range(ops_before):
        block.append_op("rft_fill", outputs={"Out": f"pad{i}"})
    block.append_op("rft_rand", outputs={"Out": "r"}, attrs={"seed": seed_attr})
    return prog


def test_random_op_with_seed_is_reproducible_and_independent_of_its_index(scratch_ops):
    seed = 123457
    a = rf.Executor().run(_rand_program(seed), fetch_list=["r"], scope=rf.Scope())[0]
    b = rf.Executor().run(_rand_program(seed, ops_before=2), fetch_list=["r"],
                          scope=rf.Scope())[0]
    other = rf.Executor().run(_rand_program(seed + 1), fetch_list=["r"], scope=rf.Scope())[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, other)


def test_random_op_draws_new_values_on_each_run(scratch_ops):
    prog, exe, scope = _rand_program(5), rf.Executor(), rf.Scope()
    first = exe.run(prog, fetch_list=["r"], scope=scope)[0]
    second = exe.run(prog, fetch_list=["r"], scope=scope)[0]
    assert not np.array_equal(first, second)
    fresh = rf.Executor().run(prog, fetch_list=["r"], scope=rf.Scope())[0]
    np.testing.assert_array_equal(first, fresh)


def test_a_restored_run_count_makes_random_ops_draw_what_that_run_drew(scratch_ops):
    prog, exe, scope = _rand_program(5), rf.Executor(), rf.Scope()
    draws = [exe.run(prog, fetch_list=["r"], scope=scope)[0] for _ in range(3)]
    assert exe.run_count(prog) == 3 and exe.run_count(rf.Program()) == 0
    resumed = rf.Executor()
    resumed.set_run_count(prog, 2)
    np.testing.assert_array_equal(resumed.run(prog, fetch_list=["r"], scope=rf.Scope())[0],
                                  draws[2])
    with pytest.raises(ExecutionError, match="count must be an int >= 0, got -1"):
        resumed.set_run_count(prog, -1)


class _HalvingSchedule:
    """The scheduler protocol the executor drives: ``()`` value, ``step()``, ``var_name``."""

    var_name = "lr"

    def __init__(self):
        self.value = 1.0

    def __call__(self):
        return self.value

    def step(self):
        self.value /= 2


def test_executor_writes_the_scheduled_learning_rate_and_steps_the_scheduler(scratch_ops):
    prog, scope, exe = rf.Program(), rf.Scope(), rf.Executor()
    block = prog.global_block()
    block.create_var(name="lr", shape=[1], dtype="float32", persistable=True)
    block.append_op("rft_scale", inputs={"X": "lr"}, outputs={"Out": "seen"})
    prog.lr_scheduler = _HalvingSchedule()
    seen = [exe.run(prog, fetch_list=["seen"], scope=scope)[0][0] for _ in range(3)]
    assert seen == [1.0, 0.5, 0.25]
    exe.run(prog.clone(for_test=True), scope=scope)
    assert prog.lr_scheduler.value == 0.125


def test_scope_reads_sets_and_deletes_arrays():
    scope = rf.Scope()
    scope["a"] = [1, 2]
    assert "a" in scope and isinstance(scope["a"], np.ndarray)
    assert scope.find_var("b") is None
    del scope["a"]
    with pytest.raises(KeyError, match="variable 'a' is not in the scope"):
        scope["a"]
