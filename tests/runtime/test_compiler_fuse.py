"""The executor's prepare step (ringflow.compiler): fused_gemm_epilogue in place of
matmul_v2 + bias + ReLU and of their grads, on by default and off with
BuildStrategy(fuse_gemm_epilogue=False), with results bitwise equal to the unfused ops;
the fused kernels against numpy formulas and finite differences; what is not fused and why."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError, ExecutionError

UNFUSED = rf.BuildStrategy(fuse_gemm_epilogue=False)


def _mlp(dtype="float32", hidden=(16, 16), dropout=0.0, optimizer=None):
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 7
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 8], dtype)
        y = rf.data("y", [-1], "int64")
        h = x
        for width in hidden:
            h = rf.nn.fc(h, width, activation="relu")
            if dropout:
                h = rf.nn.dropout(h, dropout)
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(h, 4), y))
        (optimizer or rf.optimizer.Adam(0.01)).minimize(loss)
    return main, startup, loss


def _batches(dtype, steps=6, batch=16):
    rng = np.random.default_rng(3)
    return [{"x": rng.standard_normal((batch, 8)).astype(dtype),
             "y": rng.integers(0, 4, batch)} for _ in range(steps)]


def _train(program, startup, loss, dtype, fetch_extra=()):
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    losses = []
    for feed in _batches(dtype):
        out = exe.run(program, feed=feed, fetch_list=[loss, *fetch_extra], scope=scope)
        losses.append(out[0].reshape(-1)[0])
    params = {p.name: scope[p.name].copy() for p in loss.block.program.all_parameters()}
    return losses, params, exe


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", ["adam", "sgd-dropout"])
def test_fused_training_is_bitwise_the_unfused_training(dtype, case):
    opt = rf.optimizer.SGD(0.1) if case == "sgd-dropout" else None
    main, startup, loss = _mlp(dtype, dropout=0.2 if case == "sgd-dropout" else 0.0,
                               optimizer=opt)
    fused, fused_params, exe = _train(main, startup, loss, dtype)
    plain, plain_params, _ = _train(rf.CompiledProgram(main, UNFUSED), startup, loss, dtype)
    assert fused == plain                                   # bitwise, every step
    for name in plain_params:
        np.testing.assert_array_equal(fused_params[name], plain_params[name], err_msg=name)
    plan = exe.prepared(main, [loss])
    assert (plan.count("fused_gemm_epilogue"), plan.count("fused_gemm_epilogue_grad")) == (3, 3)
    assert plan.count("matmul_v2") == plan.count("relu_grad") == 0


def test_the_plan_names_what_each_fused_step_stands_for():
    main, _, loss = _mlp()
    plan = rf.Executor().prepared(main, [loss])
    first = plan.steps[0]
    assert (first.op.type, first.replaces, first.op.attr("activation")) == (
        "fused_gemm_epilogue", (0, 1, 2), "relu")
    assert first.op.input("Bias") == ["fc_0.b_0"] and first.op.output("Out") == ["relu.tmp_2"]
    last = plan.steps[2]
    assert (last.op.attr("activation"), last.replaces) == ("none", (6, 7))  # logits: no ReLU
    assert "matmul_v2.tmp_0" in plan.hidden and "elementwise_add.tmp_1@GRAD" in plan.hidden
    assert "(program ops 0, 1, 2)" in str(plan)
    grads = [s for s in plan.steps if s.op.type == "fused_gemm_epilogue_grad"]
    assert [g.op.attr("op_role_var") for g in grads][-1] == [
        "fc_0.b_0", "fc_0.b_0@GRAD", "fc_0.w_0", "fc_0.w_0@GRAD"]
    # the ReLU's gradient goes in place into dOut, which only that layer reads
    assert [g.op.attr("inplace_grad") for g in grads] == [False, True, True]


def test_the_program_itself_is_not_changed():
    main, _, loss = _mlp()
    before = str(main)
    rf.Executor().prepared(main, [loss])
    assert str(main) == before and all(op.type != "fused_gemm_epilogue"
                                       for op in main.global_block().ops)


def test_a_fetched_intermediate_keeps_its_layer_unfused_and_has_its_value():
    main, startup, loss = _mlp(hidden=(16,))
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    feed = _batches("float32", 1)[0]
    pre = "elementwise_add.tmp_1"          # the first layer's pre-activation
    plan = exe.prepared(main, [loss, pre])
    assert pre not in plan.hidden and plan.count("fused_gemm_epilogue") == 1
    w, b = scope["fc_0.w_0"].copy(), scope["fc_0.b_0"].copy()   # before the step's update
    _, value = exe.run(main, feed=feed, fetch_list=[loss, pre], scope=scope)
    np.testing.assert_allclose(value, feed["x"] @ w + b, rtol=1e-5, atol=1e-6)


def test_a_gradient_read_twice_is_not_taken_in_place():
    """dOut read by two ops (a residual) must not be overwritten by the ReLU's gradient."""
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 1
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 8], "float64")
        y = rf.data("y", [-1], "int64")
        h = rf.nn.fc(x, 8, activation="relu")
        h2 = rf.nn.fc(h, 8, activation="relu")
        out = rf.nn.add(h, h2)                  # h is read twice
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(out, 4), y))
        rf.optimizer.SGD(0.1).minimize(loss)
    fused, fp, _ = _train(main, startup, loss, "float64")
    plain, pp, _ = _train(rf.CompiledProgram(main, UNFUSED), startup, loss, "float64")
    assert fused == plain
    for name in pp:
        np.testing.assert_array_equal(fp[name], pp[name], err_msg=name)


def numeric_grad(f, values: dict, name: str, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar f(**values) with respect to values[name]."""
    grad = np.zeros_like(values[name])
    for i in np.ndindex(grad.shape):
        for sign in (1, -1):
            moved = {k: v.copy() for k, v in values.items()}
            moved[name][i] += sign * eps
            grad[i] += sign * f(**moved) / (2 * eps)
    return grad


# the fused kernels alone ----------------------------------------------------------------------
def _fused_program(act: str, dtype="float64"):
    prog = rf.Program()
    block = prog.global_block()
    for name, shape in (("x", [5, 3]), ("w", [3, 4]), ("b", [4])):
        block.create_var(name=name, shape=shape, dtype=dtype, persistable=True)
    block.create_var(name="out", shape=[5, 4], dtype=dtype)
    block.append_op("fused_gemm_epilogue", inputs={"X": ["x"], "Y": ["w"], "Bias": ["b"]},
                    outputs={"Out": ["out"]}, attrs={"activation": act})
    return prog


@pytest.mark.parametrize("act", ["none", "relu"])
def test_fused_gemm_epilogue_is_the_numpy_formula(act):
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    scope = rf.Scope()
    scope["x"], scope["w"], scope["b"] = x, w, b
    out, = rf.Executor().run(_fused_program(act), fetch_list=["out"], scope=scope)
    want = x @ w + b
    np.testing.assert_allclose(out, np.maximum(want, 0) if act == "relu" else want, rtol=1e-12)


@pytest.mark.parametrize("act", ["none", "relu"])
def test_fused_gemm_epilogue_grad_matches_finite_differences(act):
    rng = np.random.default_rng(1)
    values = {"x": rng.standard_normal((5, 3)), "w": rng.standard_normal((3, 4)),
              "b": rng.standard_normal(4)}
    dout = rng.standard_normal((5, 4))

    def forward(**v):
        pre = v["x"] @ v["w"] + v["b"]
        return float(np.sum((np.maximum(pre, 0) if act == "relu" else pre) * dout))

    prog = _fused_program(act)
    block = prog.global_block()
    block.create_var(name="dout", shape=[5, 4], dtype="float64")
    for name in ("x", "w", "b"):
        block.create_var(name=name + "@GRAD", shape=list(values[name].shape), dtype="float64")
    block.append_op("fused_gemm_epilogue_grad",
                    inputs={"X": ["x"], "Y": ["w"], "Bias": ["b"], "Out": ["out"],
                            "Out@GRAD": ["dout"]},
                    outputs={"X@GRAD": ["x@GRAD"], "Y@GRAD": ["w@GRAD"],
                             "Bias@GRAD": ["b@GRAD"]}, attrs={"activation": act})
    scope = rf.Scope()
    for name, value in values.items():
        scope[name] = value
    scope["dout"] = dout
    got = rf.Executor().run(prog, fetch_list=["x@GRAD", "w@GRAD", "b@GRAD"], scope=scope)
    for name, grad in zip(("x", "w", "b"), got):
        np.testing.assert_allclose(grad, numeric_grad(forward, values, name), rtol=1e-6,
                                   atol=1e-8, err_msg=name)
    np.testing.assert_array_equal(scope["dout"], dout)      # not in place: nobody said so


def test_an_unknown_activation_is_refused_when_the_op_is_built():
    with pytest.raises(rf.errors.ProgramError, match="activation must be one of"):
        _fused_program("swish")


def test_build_strategy_values_are_checked():
    with pytest.raises(ConfigError, match="fuse_grad_size_in_MB must be a number > 0"):
        rf.BuildStrategy(fuse_grad_size_in_MB=0)
    with pytest.raises(ConfigError, match="fuse_gemm_epilogue must be True or False"):
        rf.BuildStrategy(fuse_gemm_epilogue="yes")
    with pytest.raises(ConfigError, match="overlap_comm must be True, False or None"):
        rf.BuildStrategy(overlap_comm=1)
    with pytest.raises(ConfigError, match="CompiledProgram takes a Program"):
        rf.CompiledProgram("main")


def test_a_changed_program_is_prepared_again():
    main, _, loss = _mlp(hidden=(16,))
    exe = rf.Executor()
    first = exe.prepared(main, [loss])
    main.global_block().append_op("scale", inputs={"X": [loss.name]},
                                  outputs={"Out": ["scaled"]}, attrs={"scale": 2.0})
    again = exe.prepared(main, [loss])
    assert again is not first and again.steps[-1].op.type == "scale"
    with pytest.raises(ExecutionError, match="is not a variable of the program"):
        exe.run(main, fetch_list=["nope"])
