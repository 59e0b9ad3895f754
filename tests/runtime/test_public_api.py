"""The runtime's public API as DESIGN.md section 4 writes it, in one process (``rf.nn.fc``
stands where the example splits a linear layer; tests/runtime/launch/test_readme_examples.py
runs the tensor-parallel version): top-level names, one training step whose loss and update
equal numpy's, ``global_scope()`` get and set, save/load, the test clone, and op roles on
every op of a full program."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

import ringflow as rf
from ringflow.framework import OpRole

LR = 1e-3


def _np_loss(scope, x, y):
    h = np.maximum(x @ scope["fc1.w"] + scope["fc_0.b_0"], 0)
    logits = h @ scope["fc2.w"] + scope["fc_1.b_0"]
    shifted = logits - logits.max(1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return -log_softmax[np.arange(len(y)), y].mean()


@pytest.fixture
def example():
    """Section 4's program, built and initialised into the global scope (cleaned after)."""
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 64], dtype="float32")
        y = rf.data("y", shape=[-1], dtype="int64")
        h = rf.nn.fc(x, 256, weight_attr=rf.ParamAttr(name="fc1.w"))
        h = rf.nn.relu(h)
        logits = rf.nn.fc(h, 10, weight_attr=rf.ParamAttr(name="fc2.w"))
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))
        opt = rf.optimizer.Adam(LR)
        optimize_ops, params_grads = opt.minimize(loss)
    exe = rf.Executor()
    before = set(rf.global_scope())
    exe.run(startup)
    rng = np.random.default_rng(4)
    feed = {"x": rng.standard_normal((16, 64)).astype("float32"),
            "y": rng.integers(0, 10, 16)}
    try:
        yield SimpleNamespace(main=main, loss=loss, logits=logits, exe=exe, feed=feed,
                              optimize_ops=optimize_ops, params_grads=params_grads)
    finally:
        rf.global_scope().drop(set(rf.global_scope()) - before)


def test_top_level_names_are_the_documented_objects():
    from ringflow import backward, executor, framework, initializer, io, optimizer

    assert rf.Program is framework.Program and rf.program_guard is framework.program_guard
    assert rf.default_main_program is framework.default_main_program
    assert rf.default_startup_program is framework.default_startup_program
    assert rf.initializer is initializer and rf.optimizer is optimizer
    for name in ("Constant", "Normal", "Uniform", "XavierUniform"):
        assert issubclass(getattr(rf.initializer, name), initializer.Initializer)
    for name in ("SGD", "Momentum", "Adam", "AdamW", "Lamb", "Lars"):
        assert issubclass(getattr(rf.optimizer, name), optimizer.Optimizer)
    for name in ("StepDecay", "CosineAnnealingDecay", "LinearWarmup"):
        assert issubclass(getattr(rf.optimizer.lr, name), optimizer.lr.LRScheduler)
    assert rf.ClipGradByGlobalNorm is optimizer.ClipGradByGlobalNorm
    assert rf.append_backward is backward.append_backward
    assert (rf.Executor, rf.Scope, rf.global_scope) == (
        executor.Executor, executor.Scope, executor.global_scope)
    assert (rf.save, rf.load) == (io.save, io.load)
    assert rf.verify is framework.verify.verify
    assert {"distributed", "nn", "data", "ParamAttr"} <= set(dir(rf))


def test_minimize_returns_update_ops_and_parameter_gradient_pairs(example):
    main, optimize_ops, params_grads = example.main, example.optimize_ops, example.params_grads
    assert [(p.name, g.name) for p, g in params_grads] == [
        ("fc1.w", "fc1.w@GRAD"), ("fc_0.b_0", "fc_0.b_0@GRAD"),
        ("fc2.w", "fc2.w@GRAD"), ("fc_1.b_0", "fc_1.b_0@GRAD")]
    assert sorted(op.input("Param")[0] for op in optimize_ops) == sorted(
        p.name for p, _ in params_grads)
    assert all(op.type == "adam" and op in main.global_block().ops for op in optimize_ops)
    assert rf.verify(main) is None


def test_one_step_fetches_numpys_loss_and_moves_each_weight_by_the_learning_rate(example):
    main, loss, exe, feed = example.main, example.loss, example.exe, example.feed
    w0 = rf.global_scope()["fc1.w"].copy()
    limit = math.sqrt(6 / (64 + 256))       # XavierUniform, the weights' default
    assert w0.shape == (64, 256) and w0.dtype == np.float32
    assert np.abs(w0).max() <= limit and np.abs(w0).max() > 0.9 * limit
    want = _np_loss(rf.global_scope(), feed["x"], feed["y"])
    loss_value, = exe.run(main, feed=feed, fetch_list=[loss])
    assert loss_value.shape == (1,) and loss_value.dtype == np.float32
    np.testing.assert_allclose(loss_value[0], want, rtol=1e-5)
    # Adam's first step is lr * g / (|g| + eps): every weight with a gradient moves by ~lr
    step = np.abs(rf.global_scope()["fc1.w"] - w0)
    assert step.max() <= LR * (1 + 1e-6) and np.median(step[step > 0]) > 0.99 * LR


def test_global_scope_assignment_is_what_the_next_run_reads(example):
    main, logits, exe, feed = example.main, example.logits, example.exe, example.feed
    scope = rf.global_scope()
    scope["fc1.w"] = np.zeros((64, 256), np.float32)
    scope["fc_0.b_0"] = np.full(256, 0.5, np.float32)
    got, = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[logits])
    # hidden = relu(0 + 0.5) for every row, so every row's logits are the same
    want = np.full((16, 256), 0.5, np.float32) @ scope["fc2.w"] + scope["fc_1.b_0"]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_save_and_load_round_trip_through_the_global_scope(example, tmp_path):
    main, exe, feed = example.main, example.exe, example.feed
    exe.run(main, feed=feed)
    saved = {n: rf.global_scope()[n].copy() for n in ("fc1.w", "fc1.w_moment1_0")}
    rf.save(main, tmp_path / "ckpt")
    rf.global_scope()["fc1.w"] = np.ones((64, 256), np.float32)
    rf.global_scope()["fc1.w_moment1_0"] = np.ones((64, 256), np.float32)
    rf.load(main, tmp_path / "ckpt")
    for name, value in saved.items():
        np.testing.assert_array_equal(rf.global_scope()[name], value)


def test_test_clone_keeps_forward_ops_parameters_and_data_only(example):
    main, params_grads = example.main, example.params_grads
    test = main.clone(for_test=True)
    block = test.global_block()
    assert [op.type for op in block.ops] == [
        "matmul_v2", "elementwise_add", "relu", "matmul_v2", "elementwise_add",
        "softmax_with_cross_entropy", "reduce_mean"]
    assert not [n for n in block.vars if "@GRAD" in n or "moment" in n or "learning_rate" in n]
    assert {p.name for p, _ in params_grads} <= set(block.vars) and {"x", "y"} <= set(block.vars)
    assert test.lr_scheduler is None and rf.verify(test) is None
    # the original is untouched
    assert len(main.global_block().ops) > len(block.ops)
    assert "fc1.w@GRAD" in main.global_block().vars


def test_every_op_of_a_full_training_program_carries_an_int_op_role():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 8], dtype="float32")
        y = rf.data("y", shape=[-1, 1], dtype="int64")
        h = rf.nn.dropout(rf.nn.layer_norm(rf.nn.fc(x, 16, activation="gelu")), 0.1)
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(h, 4), y))
        sched = rf.optimizer.lr.LinearWarmup(
            rf.optimizer.lr.CosineAnnealingDecay(0.1, T_max=10), warmup_steps=2,
            start_lr=0.0, end_lr=0.1)
        rf.optimizer.AdamW(sched, grad_clip=rf.ClipGradByGlobalNorm(1.0)).minimize(loss)
    for program in (main, startup):
        for i, op in enumerate(program.global_block().ops):
            role = op.attr("op_role")
            assert type(role) is int, f"op {i} ({op.type}): op_role {role!r}"
    roles = [op.attr("op_role") for op in main.global_block().ops]
    assert roles.count(OpRole.Forward | OpRole.Loss) == 1
    assert roles.count(OpRole.Backward | OpRole.Loss) == 1
    assert {OpRole.Forward, OpRole.Backward, OpRole.Optimize} <= set(roles)
    assert set(roles) <= {0, 1, 2, 16, 256, 257}
    assert {op.attr("op_role") for op in startup.global_block().ops} == {OpRole.Forward}


def test_op_role_flags_have_paddles_values():
    assert {name: int(r) for name, r in OpRole.__members__.items()} == {
        "Forward": 0, "Backward": 1, "Optimize": 2, "RPC": 4, "Dist": 8, "LRSched": 16,
        "Loss": 256}


def test_the_runtime_imports_nothing_but_the_standard_library_and_numpy():
    # provider/ringflow is shipped to training hosts with python3 + numpy only (DESIGN.md 1)
    script = textwrap.dedent("""
        import sys
        at_start = {m.split(".")[0] for m in sys.modules}      # site hooks, __main__
        import importlib, pkgutil, ringflow
        for mod in pkgutil.walk_packages(ringflow.__path__, "ringflow."):
            if not mod.name.endswith("__main__"):
                importlib.import_module(mod.name)
        loaded = {m.split(".")[0] for m in sys.modules} - at_start
        print(sorted(loaded - set(sys.stdlib_module_names) - {"ringflow", "numpy"}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
