"""The fuse_all_optimizer_ops pass (compiler/fuse_optimizer.py): the update ops of one kind,
learning rate and attributes run as one step over their parameters and state laid end to
end, on by default and off with BuildStrategy(fuse_all_optimizer_ops=False), with losses,
parameters and optimizer state bitwise those of the unfused ops; what is grouped apart and
what is not fused; arrays put into the scope between runs are taken up."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.compiler import fuse_optimizer
from ringflow.compiler.plan import program_steps

UNFUSED = rf.BuildStrategy(fuse_all_optimizer_ops=False)
UPDATES = ("sgd", "momentum", "adam", "adamw", "lamb", "lars_momentum")

OPTIMIZERS = {
    "sgd": lambda: rf.optimizer.SGD(0.1),
    "momentum-nesterov-l2": lambda: rf.optimizer.Momentum(
        0.05, 0.9, use_nesterov=True, weight_decay=rf.optimizer.L2Decay(1e-3)),
    "adam-clip": lambda: rf.optimizer.Adam(0.01, grad_clip=rf.ClipGradByGlobalNorm(0.5)),
    "adamw-some-decay": lambda: rf.optimizer.AdamW(
        0.01, weight_decay=0.1, apply_decay_param_fun=lambda name: ".w_" in name),
    "lamb-exclude-bias": lambda: rf.optimizer.Lamb(
        0.01, exclude_from_weight_decay_fn=lambda p: ".b_" in p.name),
    "lars": lambda: rf.optimizer.LarsMomentum(0.1, 0.9, exclude_from_weight_decay=["b_0"]),
}
# update steps of the fused plan: one per group of one kind, learning rate and attributes
GROUPS = {"sgd": 1, "momentum-nesterov-l2": 1, "adam-clip": 1, "adamw-some-decay": 2,
          "lamb-exclude-bias": 2, "lars": 2}


def _mlp(optimizer, dtype="float32"):
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 11
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 8], dtype)
        y = rf.data("y", [-1], "int64")
        h = rf.nn.fc(x, 16, activation="relu")
        h = rf.nn.fc(h, 12, activation="relu")
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(h, 4), y))
        optimizer().minimize(loss)
    return main, startup, loss


def _feeds(dtype="float32", steps=5):
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((16, 8)).astype(dtype), "y": rng.integers(0, 4, 16)}
            for _ in range(steps)]


def _persistables(main, scope):
    return {v.name: np.array(scope[v.name]) for v in main.list_vars()
            if v.persistable and v.name in scope}


def _train(optimizer, strategy, dtype="float32", between=None):
    main, startup, loss = _mlp(optimizer, dtype)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    compiled = rf.CompiledProgram(main, strategy)
    losses = []
    for step, feed in enumerate(_feeds(dtype)):
        if between is not None:
            between(step, main, scope)
        losses.append(exe.run(compiled, feed=feed, fetch_list=[loss], scope=scope)[0].item())
    return losses, _persistables(main, scope), exe, scope, exe.prepared(compiled, [loss])


def _assert_same(a, b):
    assert a[0] == b[0]                                      # every loss, bitwise
    assert a[1].keys() == b[1].keys()
    for name in a[1]:                                        # parameters, moments, pows
        np.testing.assert_array_equal(a[1][name], b[1][name], err_msg=name)


@pytest.mark.parametrize("case", list(OPTIMIZERS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_updates_train_bitwise_as_the_unfused_ops(case, dtype):
    fused = _train(OPTIMIZERS[case], rf.BuildStrategy(), dtype)
    plain = _train(OPTIMIZERS[case], UNFUSED, dtype)
    _assert_same(fused, plain)
    steps = [s for s in fused[4].steps if s.op.type in UPDATES]
    assert len(steps) == GROUPS[case]
    assert sum(len(s.op.inputs["Param"]) for s in steps) == 6     # 3 weights, 3 biases
    assert len([s for s in plain[4].steps if s.op.type in UPDATES]) == 6


def test_parameters_state_and_gradients_become_views_of_one_buffer():
    _, _, exe, scope, plan = _train(OPTIMIZERS["adam-clip"], rf.BuildStrategy())
    step = next(s for s in plan.steps if s.op.type == "adam")
    assert step.replaces == tuple(range(step.replaces[0], step.replaces[0] + 6))
    flat, = exe.flat_state(scope).values()
    for slot in ("Param", "Moment1", "Moment2", "Grad"):
        arrays = [scope[n] for n in step.op.inputs[slot]]
        buffer = flat.buffers[slot] if slot != "Grad" else arrays[0].base
        assert all(np.shares_memory(a, buffer) for a in arrays), slot
        assert sum(a.size for a in arrays) == buffer.size
        assert all(exe.owns(n, a) for n, a in zip(step.op.inputs[slot], arrays))
    assert len(flat._spans) == 1          # the gradients lie end to end: one sweep
    assert len(set(step.op.inputs["Param"])) == 6
    assert f"(program ops {', '.join(map(str, step.replaces))})" in str(plan)


def test_arrays_put_into_the_scope_between_runs_are_taken_up_and_left_untouched():
    """A checkpoint load (or a user) puts new arrays in place of the views: the fused step
    copies them in and trains on from them, as the unfused ops do; the arrays given are
    not written."""
    given: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def reload(step, main, scope):
        if step == 3:
            for name in ("fc_1.w_0", "fc_1.w_0_moment1_0", "fc_0.b_0_moment2_0"):
                arr = np.array(scope[name]) * 0.5
                given[name] = (arr, arr.copy())
                scope[name] = arr

    fused = _train(OPTIMIZERS["adam-clip"], rf.BuildStrategy(), between=reload)
    for name, (arr, before) in given.items():
        np.testing.assert_array_equal(arr, before, err_msg=name)   # not written
        assert not np.shares_memory(arr, fused[3][name])           # the scope has a view
    _assert_same(fused, _train(OPTIMIZERS["adam-clip"], UNFUSED, between=reload))


def test_parameters_at_different_steps_are_updated_one_by_one():
    """Beta powers that differ (a parameter that joined later) give each its own bias
    correction, as the unfused ops do."""
    def skew(step, main, scope):
        if step == 0:
            scope["fc_2.w_0_beta1_pow_acc_0"] = np.array([0.9 ** 4], dtype=np.float32)
            scope["fc_2.w_0_beta2_pow_acc_0"] = np.array([0.999 ** 4], dtype=np.float32)

    _assert_same(_train(OPTIMIZERS["adam-clip"], rf.BuildStrategy(), between=skew),
                 _train(OPTIMIZERS["adam-clip"], UNFUSED, between=skew))


def test_plans_with_other_fetch_lists_share_the_buffers():
    main, startup, loss = _mlp(OPTIMIZERS["adam-clip"])
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    ref_exe, ref_scope = rf.Executor(), rf.Scope()
    ref_exe.run(startup, scope=ref_scope)
    lr_name = next(v.name for v in main.list_vars() if v.name.startswith("learning_rate"))
    for step, feed in enumerate(_feeds()):
        fetch = [loss] if step % 2 else [loss, lr_name]
        got = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)[0]
        want = ref_exe.run(rf.CompiledProgram(main, UNFUSED), feed=feed, fetch_list=[loss],
                           scope=ref_scope)[0]
        assert got.item() == want.item()
    assert len(exe.flat_state(scope)) == 1


def _sgd_block(chained: bool):
    main = rf.Program()
    block = main.global_block()
    for name in ("a", "b", "ga", "gb", "lr"):
        block.create_var(name=name, shape=[3], dtype="float32", persistable=True)
    block.append_op("sgd", inputs={"Param": ["a"], "Grad": ["ga"], "LearningRate": ["lr"]},
                    outputs={"ParamOut": ["a"]}, attrs={})
    # chained: the second update reads what the first wrote, so their order matters
    block.append_op("sgd", inputs={"Param": ["b"], "Grad": ["a" if chained else "gb"],
                                   "LearningRate": ["lr"]}, outputs={"ParamOut": ["b"]},
                    attrs={})
    return main, block


@pytest.mark.parametrize("chained, fused", [(False, 1), (True, 0)])
def test_updates_that_read_each_others_output_are_not_fused(chained, fused):
    main, block = _sgd_block(chained)
    steps = fuse_optimizer.fuse(program_steps(main), block)
    assert sum(len(s.op.inputs["Param"]) > 1 for s in steps) == fused
    scope = rf.Scope()
    for name, value in {"a": [1.0, 2, 3], "b": [4.0, 5, 6], "ga": [1.0, 1, 1],
                        "gb": [2.0, 2, 2], "lr": [0.5]}.items():
        scope[name] = np.array(value, dtype=np.float32)
    rf.Executor().run(main, scope=scope)
    np.testing.assert_array_equal(scope["a"], [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(scope["b"], [3.75, 4.25, 4.75] if chained else [3, 4, 5])


def test_an_update_with_a_gradient_of_another_shape_fails_naming_it():
    main, _ = _sgd_block(False)
    scope = rf.Scope()
    for name, value in {"a": [1.0, 2, 3], "b": [4.0, 5, 6], "ga": [1.0, 1, 1],
                        "gb": [2.0, 2], "lr": [0.5]}.items():
        scope[name] = np.array(value, dtype=np.float32)
    with pytest.raises(rf.errors.ExecutionError, match=r"Grad 'gb' is float32\[2\]"):
        rf.Executor().run(main, scope=scope)


def test_the_switch_is_checked_and_the_program_is_not_changed():
    with pytest.raises(rf.errors.ConfigError, match="fuse_all_optimizer_ops must be True or"):
        rf.BuildStrategy(fuse_all_optimizer_ops=1)
    main, _, loss = _mlp(OPTIMIZERS["adam-clip"])
    before = str(main)
    rf.Executor().prepared(main, [loss])
    assert str(main) == before and [op.type for op in main.global_block().ops].count(
        "adam") == 6
