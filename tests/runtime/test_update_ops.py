"""Update ops (sgd, momentum, adam, adamw, lamb, lars_momentum) and squared_l2_norm against
hand-written numpy formulas, in float64; arrays large enough to be cut into chunks spread
over threads give the same result as small ones."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.executor import Executor, Scope
from ringflow.framework.program import Program
from ringflow.ops import _chunked

# slot -> variable name; an update op writes ParamOut back into Param, etc.
NAMES = {"Param": "w", "Grad": "w@GRAD", "LearningRate": "lr", "Velocity": "w_velocity_0",
         "Moment1": "w_moment1_0", "Moment2": "w_moment2_0", "Beta1Pow": "w_beta1_pow_acc_0",
         "Beta2Pow": "w_beta2_pow_acc_0"}


def run_update(op_type: str, state: dict[str, np.ndarray], attrs: dict, steps: int = 1):
    """Runs ``op_type`` ``steps`` times on copies of ``state``; returns slot -> array."""
    prog = Program()
    block = prog.global_block()
    for slot, arr in state.items():
        block.create_var(name=NAMES[slot], shape=arr.shape, dtype=arr.dtype, persistable=True)
    outputs = {f"{slot}Out": NAMES[slot] for slot in state
               if slot not in ("Grad", "LearningRate")}
    block.append_op(op_type, inputs={s: NAMES[s] for s in state}, outputs=outputs,
                    attrs=attrs)
    scope = Scope()
    for slot, arr in state.items():
        scope[NAMES[slot]] = arr.copy()
    exe = Executor()
    for _ in range(steps):
        exe.run(prog, scope=scope)
    return {slot: scope[NAMES[slot]] for slot in state}


@pytest.fixture(params=[(3, 5), (70001,)], ids=["small", "chunked"])
def shape(request, monkeypatch):
    if request.param != (3, 5):
        monkeypatch.setenv("RINGFLOW_NUM_THREADS", "2")
        monkeypatch.setattr(_chunked, "CHUNK", 4096)
        monkeypatch.setattr(_chunked, "MIN_PARALLEL", 8192)
    return request.param


def arrays(shape, *names, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(shape) for n in names}


LR = np.array([0.05])


def test_sgd_subtracts_lr_times_grad(shape):
    a = arrays(shape, "Param", "Grad")
    out = run_update("sgd", {**a, "LearningRate": LR}, {})
    np.testing.assert_allclose(out["Param"], a["Param"] - 0.05 * a["Grad"], rtol=1e-13)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_two_steps_match_formula(shape, nesterov):
    a = arrays(shape, "Param", "Grad", "Velocity")
    out = run_update("momentum", {**a, "LearningRate": LR},
                     {"mu": 0.9, "use_nesterov": nesterov}, steps=2)
    p, v, g = a["Param"].copy(), a["Velocity"].copy(), a["Grad"]
    for _ in range(2):
        v = 0.9 * v + g
        p = p - 0.05 * (g + 0.9 * v) if nesterov else p - 0.05 * v
    np.testing.assert_allclose(out["Velocity"], v, rtol=1e-13)
    np.testing.assert_allclose(out["Param"], p, rtol=1e-12, atol=1e-14)


def test_momentum_l2_decay_adds_coeff_times_param_to_grad(shape):
    a = arrays(shape, "Param", "Grad", "Velocity")
    out = run_update("momentum", {**a, "LearningRate": LR},
                     {"mu": 0.5, "regularization_method": "l2_decay",
                      "regularization_coeff": 0.1})
    v = 0.5 * a["Velocity"] + a["Grad"] + 0.1 * a["Param"]
    np.testing.assert_allclose(out["Param"], a["Param"] - 0.05 * v, rtol=1e-12, atol=1e-14)


def adam_state(shape):
    a = arrays(shape, "Param", "Grad", "Moment1")
    a["Moment2"] = np.abs(arrays(shape, "Moment2", seed=1)["Moment2"])
    return {**a, "LearningRate": LR, "Beta1Pow": np.array([0.9 ** 3]),
            "Beta2Pow": np.array([0.999 ** 3])}


def numpy_adam(st, b1=0.9, b2=0.999, eps=1e-8, coeff=0.0, steps=2):
    """torch.optim.Adam's textbook form (bias corrections on m and v), after AdamW's
    decoupled decay; beta powers as given (step t reads beta^t)."""
    p, m, v = st["Param"].copy(), st["Moment1"].copy(), st["Moment2"].copy()
    g, lr = st["Grad"], float(st["LearningRate"][0])
    b1p, b2p = float(st["Beta1Pow"][0]), float(st["Beta2Pow"][0])
    for _ in range(steps):
        p = p * (1 - lr * coeff)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1p)) / (np.sqrt(v / (1 - b2p)) + eps)
        b1p, b2p = b1p * b1, b2p * b2
    return p, m, v, b1p, b2p


def test_adam_two_steps_match_textbook_formula(shape):
    st = adam_state(shape)
    out = run_update("adam", st, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}, steps=2)
    p, m, v, b1p, b2p = numpy_adam(st)
    np.testing.assert_allclose(out["Moment1"], m, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out["Moment2"], v, rtol=1e-12)
    np.testing.assert_allclose(out["Param"], p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out["Beta1Pow"], [b1p], rtol=1e-15)
    np.testing.assert_allclose(out["Beta2Pow"], [b2p], rtol=1e-15)


def test_adamw_decays_param_by_lr_times_coeff(shape):
    st = adam_state(shape)
    out = run_update("adamw", st, {"coeff": 0.1}, steps=2)
    p, *_ = numpy_adam(st, coeff=0.1)
    np.testing.assert_allclose(out["Param"], p, rtol=1e-12, atol=1e-15)


def test_adamw_without_decay_equals_adam(shape):
    st = adam_state(shape)
    out = run_update("adamw", st, {"coeff": 0.1, "with_decay": False})
    p, *_ = numpy_adam(st, steps=1)
    np.testing.assert_allclose(out["Param"], p, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_scales_direction_by_trust_ratio(shape, wd):
    st = adam_state(shape)
    out = run_update("lamb", st, {"weight_decay": wd, "epsilon": 1e-6})
    g, p = st["Grad"], st["Param"]
    m = 0.9 * st["Moment1"] + 0.1 * g
    v = 0.999 * st["Moment2"] + 0.001 * g * g
    r = (m / (1 - 0.9 ** 3)) / (np.sqrt(v / (1 - 0.999 ** 3)) + 1e-6) + wd * p
    trust = np.linalg.norm(p) / np.linalg.norm(r)
    np.testing.assert_allclose(out["Param"], p - 0.05 * trust * r, rtol=1e-11)
    np.testing.assert_allclose(out["Moment2"], v, rtol=1e-12)
    np.testing.assert_allclose(out["Beta1Pow"], [0.9 ** 4], rtol=1e-15)


def test_lamb_trust_ratio_is_one_for_zero_param():
    st = adam_state((4,))
    st["Param"] = np.zeros(4)
    out = run_update("lamb", st, {"weight_decay": 0.0, "epsilon": 1e-6})
    m = 0.9 * st["Moment1"] + 0.1 * st["Grad"]
    v = 0.999 * st["Moment2"] + 0.001 * st["Grad"] ** 2
    r = (m / (1 - 0.9 ** 3)) / (np.sqrt(v / (1 - 0.999 ** 3)) + 1e-6)
    np.testing.assert_allclose(out["Param"], -0.05 * r, rtol=1e-12)


def test_lars_momentum_uses_layerwise_local_lr(shape):
    a = arrays(shape, "Param", "Grad", "Velocity")
    attrs = {"mu": 0.9, "lars_coeff": 0.002, "lars_weight_decay": 0.01, "epsilon": 1e-9}
    out = run_update("lars_momentum", {**a, "LearningRate": LR}, attrs)
    p, g = a["Param"], a["Grad"]
    pn, gn = np.linalg.norm(p), np.linalg.norm(g)
    local_lr = 0.05 * 0.002 * pn / (gn + 0.01 * pn + 1e-9)
    v = 0.9 * a["Velocity"] + local_lr * (g + 0.01 * p)
    np.testing.assert_allclose(out["Velocity"], v, rtol=1e-12)
    np.testing.assert_allclose(out["Param"], p - v, rtol=1e-12)


def test_lars_momentum_without_decay_is_momentum_with_lr():
    a = arrays((5,), "Param", "Grad", "Velocity")
    out = run_update("lars_momentum", {**a, "LearningRate": LR},
                     {"mu": 0.9, "lars_weight_decay": 0.0})
    v = 0.9 * a["Velocity"] + 0.05 * a["Grad"]
    np.testing.assert_allclose(out["Param"], a["Param"] - v, rtol=1e-13)


def test_update_does_not_write_into_an_array_the_user_put_in_the_scope():
    prog = Program()
    block = prog.global_block()
    for n in ("w", "w@GRAD", "lr"):
        block.create_var(name=n, shape=(3,), dtype="float64", persistable=True)
    block.append_op("sgd", inputs={"Param": "w", "Grad": "w@GRAD", "LearningRate": "lr"},
                    outputs={"ParamOut": "w"})
    mine = np.ones(3)
    scope = Scope()
    scope["w"], scope["w@GRAD"], scope["lr"] = mine, np.ones(3), np.array([0.5])
    exe = Executor()
    exe.run(prog, scope=scope)
    exe.run(prog, scope=scope)
    np.testing.assert_array_equal(mine, np.ones(3))
    np.testing.assert_array_equal(scope["w"], np.zeros(3))


def test_update_keeps_float32_params_float32():
    a = {k: v.astype(np.float32) for k, v in arrays((6,), "Param", "Grad").items()}
    out = run_update("sgd", {**a, "LearningRate": LR.astype(np.float32)}, {})
    assert out["Param"].dtype == np.float32


def test_squared_l2_norm_is_sum_of_squares():
    x = np.random.default_rng(3).standard_normal((4, 7))
    prog = Program()
    block = prog.global_block()
    block.create_var(name="x", shape=(4, 7), dtype="float64")
    block.append_op("squared_l2_norm", inputs={"X": "x"}, outputs={"Out": "sq"})
    assert block.var("sq").shape == (1,)
    scope = Scope()
    scope["x"] = x
    Executor().run(prog, scope=scope)
    np.testing.assert_allclose(scope["sq"], [np.sum(x * x)], rtol=1e-13)


def test_profiling_executor_counts_calls_and_time_per_op_type():
    prog = Program()
    block = prog.global_block()
    block.create_var(name="x", shape=(3,), dtype="float64")
    block.append_op("squared_l2_norm", inputs={"X": "x"}, outputs={"Out": "sq"})
    block.append_op("squared_l2_norm", inputs={"X": "x"}, outputs={"Out": "sq2"})
    exe, scope = Executor(profile=True), Scope()
    for _ in range(3):
        exe.run(prog, feed={"x": np.ones(3)}, scope=scope)
    calls, seconds = exe.profile_stats()["squared_l2_norm"]
    assert calls == 6 and seconds > 0
    exe.reset_profile()
    assert exe.profile_stats() == {}
    assert Executor().profile_stats() == {}  # off by default: nothing recorded


def test_squared_l2_norm_grad_matches_finite_differences():
    x = np.random.default_rng(4).standard_normal((3, 2))
    prog = Program()
    block = prog.global_block()
    block.create_var(name="x", shape=(3, 2), dtype="float64")
    block.create_var(name="sq@GRAD", shape=(1,), dtype="float64")
    block.append_op("squared_l2_norm_grad", inputs={"X": "x", "Out@GRAD": "sq@GRAD"},
                    outputs={"X@GRAD": "x@GRAD"})
    scope = Scope()
    Executor().run(prog, feed={"x": x, "sq@GRAD": np.array([0.7])}, scope=scope)
    eps, numeric = 1e-6, np.empty_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = 0.7 * (np.sum(up * up) - np.sum(down * down)) / (2 * eps)
    np.testing.assert_allclose(scope["x@GRAD"], numeric, rtol=1e-5)
