"""Optimizer classes: the update ops they append (role Optimize, op_role_var, sorted by
parameter name), the state they initialise in the startup program, and one or two steps of
each equal to a hand-computed numpy update (float64). Gradients are fed, so these tests
need no backward pass; test_mlp_training.py covers minimize end to end."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow import optimizer as opt
from ringflow.errors import ConfigError
from ringflow.executor import Executor, Scope
from ringflow.framework.program import Program, program_guard
from ringflow.framework.roles import OP_ROLE_VAR_KEY, OpRole, is_optimizer_op, is_update_op

SHAPES = {"w": (3, 4), "b": (4,)}


def build(optimizer, shapes=SHAPES, dtype="float64"):
    """Parameters (given in reverse name order) with fed gradients; apply_gradients."""
    main, startup = Program(), Program()
    with program_guard(main, startup):
        block = main.global_block()
        pairs = []
        for name, shape in shapes.items():
            p = block.create_parameter(name, shape, dtype)
            g = block.create_var(name=f"{name}@GRAD", shape=shape, dtype=dtype, is_data=True)
            pairs.append((p, g))
        ops = optimizer.apply_gradients(pairs)
    return main, startup, ops


def start(main, startup, seed=0):
    rng = np.random.default_rng(seed)
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    params = {n: rng.standard_normal(s) for n, s in SHAPES.items()}
    grads = {f"{n}@GRAD": rng.standard_normal(s) for n, s in SHAPES.items()}
    for n, v in params.items():
        scope[n] = v.copy()
    return exe, scope, params, grads


def run_steps(optimizer, steps=1):
    main, startup, _ = build(optimizer)
    exe, scope, params, grads = start(main, startup)
    for _ in range(steps):
        exe.run(main, feed=grads, scope=scope)
    return {n: scope[n] for n in SHAPES}, params, {n[:-5]: g for n, g in grads.items()}


def test_update_ops_sorted_by_param_name_with_role_optimize_and_role_var():
    main, _, ops = build(opt.Adam(0.1))
    assert [op.type for op in ops] == ["adam", "adam"]
    assert [op.input("Param") for op in ops] == [["b"], ["w"]]
    for op in ops:
        assert op.attr("op_role") == int(OpRole.Optimize)
        assert is_optimizer_op(op) and is_update_op(op)
        p = op.input("Param")[0]
        assert op.attr(OP_ROLE_VAR_KEY) == [p, f"{p}@GRAD"]
        assert op.output("ParamOut") == [p] and op.output("Moment1Out") == op.input("Moment1")
    assert main.global_block().ops == ops


def test_startup_initialises_learning_rate_then_accumulators():
    main, startup, _ = build(opt.Adam(0.1, beta1=0.8, beta2=0.99))
    fills = {op.output("Out")[0]: op.attr("value") for op in startup.global_block().ops}
    assert startup.global_block().ops[0].output("Out") == ["learning_rate_0"]
    assert fills == {"learning_rate_0": 0.1,
                     "b_moment1_0": 0.0, "b_moment2_0": 0.0,
                     "b_beta1_pow_acc_0": 0.8, "b_beta2_pow_acc_0": 0.99,
                     "w_moment1_0": 0.0, "w_moment2_0": 0.0,
                     "w_beta1_pow_acc_0": 0.8, "w_beta2_pow_acc_0": 0.99}
    for name in fills:
        var = main.global_block().var(name)
        assert var.persistable and var.dtype == "float64"
    assert main.global_block().var("w_moment1_0").shape == (3, 4)
    assert main.global_block().var("w_beta1_pow_acc_0").shape == (1,)
    _, scope, _, _ = start(main, startup)
    np.testing.assert_array_equal(scope["w_moment2_0"], np.zeros((3, 4)))
    np.testing.assert_array_equal(scope["w_beta2_pow_acc_0"], [0.99])


def test_sgd_step():
    new, p, g = run_steps(opt.SGD(0.1))
    for n in SHAPES:
        np.testing.assert_allclose(new[n], p[n] - 0.1 * g[n], rtol=1e-14)


def test_sgd_weight_decay_adds_l2_term_to_the_gradient():
    new, p, g = run_steps(opt.SGD(0.1, weight_decay=0.5))
    for n in SHAPES:
        np.testing.assert_allclose(new[n], p[n] - 0.1 * (g[n] + 0.5 * p[n]), rtol=1e-13)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_two_steps(nesterov):
    new, p, g = run_steps(opt.Momentum(0.1, momentum=0.9, use_nesterov=nesterov), steps=2)
    for n in SHAPES:
        q, v = p[n].copy(), np.zeros_like(p[n])
        for _ in range(2):
            v = 0.9 * v + g[n]
            q = q - 0.1 * (g[n] + 0.9 * v if nesterov else v)
        np.testing.assert_allclose(new[n], q, rtol=1e-12)


def test_momentum_weight_decay_goes_into_the_update_op():
    _, _, ops = build(opt.Momentum(0.1, weight_decay=0.01))
    assert [op.type for op in ops] == ["momentum", "momentum"]
    assert ops[0].attr("regularization_method") == "l2_decay"
    assert ops[0].attr("regularization_coeff") == 0.01


def torch_adam(p, g, steps, lr=0.01, b1=0.9, b2=0.999, eps=1e-8, decay=0.0):
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t in range(1, steps + 1):
        p = p * (1 - lr * decay)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def test_adam_three_steps_equal_torch_formula_from_fresh_state():
    new, p, g = run_steps(opt.Adam(0.01), steps=3)
    for n in SHAPES:
        np.testing.assert_allclose(new[n], torch_adam(p[n], g[n], 3), rtol=1e-12)


def test_adamw_decoupled_decay_only_where_apply_decay_param_fun_says():
    o = opt.AdamW(0.01, weight_decay=0.1, apply_decay_param_fun=lambda name: name == "w")
    new, p, g = run_steps(o, steps=2)
    np.testing.assert_allclose(new["w"], torch_adam(p["w"], g["w"], 2, decay=0.1), rtol=1e-12)
    np.testing.assert_allclose(new["b"], torch_adam(p["b"], g["b"], 2), rtol=1e-12)


def test_lamb_step_scales_by_trust_ratio():
    new, p, g = run_steps(opt.Lamb(0.01, lamb_weight_decay=0.02))
    for n in SHAPES:
        m, v = 0.1 * g[n], 0.001 * g[n] ** 2
        r = (m / 0.1) / (np.sqrt(v / 0.001) + 1e-6) + 0.02 * p[n]
        trust = np.linalg.norm(p[n]) / np.linalg.norm(r)
        np.testing.assert_allclose(new[n], p[n] - 0.01 * trust * r, rtol=1e-12)


def test_lars_momentum_step_and_exclusion():
    o = opt.LarsMomentum(0.1, momentum=0.9, lars_coeff=0.01, lars_weight_decay=0.001,
                         exclude_from_weight_decay=["b"])
    assert opt.Lars is opt.LarsMomentum is opt.LarsMomentumOptimizer
    new, p, g = run_steps(o)
    pn, gn = np.linalg.norm(p["w"]), np.linalg.norm(g["w"])
    local = 0.1 * 0.01 * pn / (gn + 0.001 * pn)
    np.testing.assert_allclose(new["w"], p["w"] - local * (g["w"] + 0.001 * p["w"]),
                               rtol=1e-12)
    np.testing.assert_allclose(new["b"], p["b"] - 0.1 * g["b"], rtol=1e-13)


def test_per_parameter_learning_rate_multiplier():
    o = opt.SGD(0.1)
    main, startup = Program(), Program()
    with program_guard(main, startup):
        block = main.global_block()
        p = block.create_parameter("w", (2,), "float64")
        p.optimize_attr["learning_rate"] = 3.0
        g = block.create_var(name="w@GRAD", shape=(2,), dtype="float64", is_data=True)
        o.apply_gradients([(p, g)])
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    scope["w"] = np.zeros(2)
    exe.run(main, feed={"w@GRAD": np.ones(2)}, scope=scope)
    np.testing.assert_allclose(scope["w"], [-0.3, -0.3], rtol=1e-15)


def test_scheduler_is_attached_to_main_program_and_initialises_the_rate():
    sched = opt.lr.StepDecay(0.5, step_size=1, gamma=0.5)
    main, startup, ops = build(opt.SGD(sched))
    assert main.lr_scheduler is sched
    assert sched.var_name == ops[0].input("LearningRate")[0] == "learning_rate_0"
    exe, scope, p, g = start(main, startup)
    exe.run(main, feed=g, scope=scope)
    exe.run(main, feed=g, scope=scope)
    np.testing.assert_allclose(scope["w"], p["w"] - 0.75 * g["w@GRAD"], rtol=1e-14)


def test_learning_rate_must_be_a_number_or_a_scheduler():
    with pytest.raises(ConfigError, match="learning_rate"):
        opt.Adam("0.1")
    with pytest.raises(ConfigError, match="beta1"):
        opt.Adam(0.1, beta1=1.5)
