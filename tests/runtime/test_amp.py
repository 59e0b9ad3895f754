"""ringflow.amp (Paddle's static AMP, level O1): the rewrite puts white-listed ops in
float16 behind casts of the float32 parameters, keeps black-listed ones in float32, scales
the loss, unscales and checks the gradients, and a step whose gradients overflow changes no
parameter or moment while the loss scale falls; finite steps make it grow again."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.amp import AutoMixedPrecisionLists, decorate
from ringflow.errors import ConfigError
from ringflow.framework.roles import OP_ROLE_KEY, OpRole
from ringflow.models import mlp, transformer

SEED = 4


def build(amp: bool, kind: str = "mlp", make_opt=lambda: rf.optimizer.Adam(0.01), **scaling):
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = SEED
    with rf.program_guard(main, startup):
        if kind == "mlp":
            model = mlp(input_size=16, hidden_size=32, num_classes=8, num_layers=2)
        else:
            model = transformer(vocab_size=32, seq_len=8, hidden_size=16, num_heads=4,
                                num_layers=2, ffn_size=32)
        opt = make_opt()
        if amp:
            opt = decorate(opt, **scaling)
        opt.minimize(model.loss)
    rf.verify(main)
    rf.verify(startup)
    return main, startup, model, opt


def ops_of(main, op_type):
    return [op for op in main.global_block().ops if op.type == op_type]


def role(op) -> int:
    return int(op.attr(OP_ROLE_KEY))


def test_matmuls_read_float16_casts_of_the_float32_parameters():
    main, *_ = build(True)
    block = main.global_block()
    for op in ops_of(main, "matmul_v2"):
        assert [block.var(n).dtype for n in op.input_arg_names] == ["float16", "float16"]
        assert block.var(op.output("Out")[0]).dtype == "float16"
    weight_casts = [op for op in ops_of(main, "cast") if role(op) == OpRole.Forward
                    and block.var(op.input("X")[0]).persistable]
    assert sorted(op.output("Out")[0] for op in weight_casts) == sorted(
        f"{p.name}.cast_fp16" for p in main.all_parameters())
    assert all(p.dtype == "float32" for p in main.all_parameters())   # master weights


def test_black_listed_ops_read_float32_casts():
    main, *_ = build(True, "transformer")
    block = main.global_block()
    for op_type in ("softmax_with_cross_entropy", "layer_norm", "softmax", "reduce_mean"):
        for op in ops_of(main, op_type):
            assert {block.var(n).dtype for n in op.input_arg_names
                    if block.var(n).dtype.startswith("float")} == {"float32"}, op_type
    sxe = ops_of(main, "softmax_with_cross_entropy")[0]
    assert sxe.input("Logits")[0].endswith(".cast_fp32")


def test_float16_gradients_are_cast_back_as_optimizer_ops_after_the_backward_pass():
    main, *_ = build(True)
    block = main.global_block()
    moved = [op for op in ops_of(main, "cast") if role(op) == OpRole.Optimize]
    assert len(moved) == len(main.all_parameters())
    last_backward = max(i for i, op in enumerate(block.ops) if role(op) & OpRole.Backward)
    assert all(block.index_of(op) > last_backward for op in moved)
    assert all(not op.attr("op_role_var") for op in moved)
    for op in moved:   # the float16 gradient's writer names it in its op_role_var
        fp16 = op.input("X")[0]
        writer = [w for w in block.ops if fp16 in w.output_arg_names][-1]
        assert fp16 in writer.attr("op_role_var")
        assert block.var(fp16).dtype == "float16"


def test_the_optimizer_section_checks_scales_and_brackets_the_updates():
    main, startup, *_ = build(True)
    types = [op.type for op in main.global_block().ops if role(op) == OpRole.Optimize
             and op.type != "cast"]
    assert types[:3] == ["check_finite_and_unscale", "update_loss_scaling",
                         "skip_update_begin"]
    assert types[3:-1] == ["adam"] * 8 and types[-1] == "skip_update_end"
    scaled = ops_of(main, "elementwise_mul")[0]
    assert scaled.input("Y") == ["loss_scaling_0"] and role(scaled) & OpRole.Loss
    fills = {op.output("Out")[0]: op.attr("value") for op in startup.global_block().ops
             if op.type == "fill_constant"}
    assert (fills["loss_scaling_0"], fills["num_good_steps_0"],
            fills["num_bad_steps_0"]) == (32768.0, 0, 0)


def test_amp_trains_like_float32_within_float16_rounding():
    losses = {}
    for amp in (False, True):
        main, startup, model, _ = build(amp, init_loss_scaling=1024.0)
        exe, scope = rf.Executor(), rf.Scope()
        exe.run(startup, scope=scope)
        losses[amp] = [float(exe.run(main, feed=model.make_batch(SEED, s, 16),
                                     fetch_list=[model.loss], scope=scope)[0][0])
                       for s in range(6)]
    np.testing.assert_allclose(losses[True], losses[False], rtol=5e-3)


def _state(main, scope) -> dict[str, np.ndarray]:
    return {v.name: np.array(scope[v.name]) for v in main.list_vars()
            if v.persistable and v.name in scope}


def test_an_overflowing_step_is_skipped_and_the_scale_halves_then_grows_again():
    main, startup, model, opt = build(True, init_loss_scaling=8.0, incr_every_n_steps=2,
                                      decr_every_n_nan_or_inf=1, decr_ratio=0.5)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    scale = opt.get_loss_scaling().name
    exe.run(main, feed=model.make_batch(SEED, 0, 16), scope=scope)
    before = _state(main, scope)
    batch = model.make_batch(SEED, 1, 16)
    batch["x"][0, 0] = 1e5          # beyond float16: the forward pass overflows
    with np.errstate(invalid="ignore"):     # inf * 0 in the GEMMs of that step
        exe.run(main, feed=batch, scope=scope)
    after = _state(main, scope)
    for name, value in before.items():
        if name not in (scale, "num_good_steps_0", "num_bad_steps_0"):
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert (after[scale][0], after["num_good_steps_0"][0]) == (4.0, 0)
    for step in (2, 3):             # two finite steps: the scale doubles
        exe.run(main, feed=model.make_batch(SEED, step, 16), scope=scope)
    assert scope[scale][0] == 8.0
    assert not np.array_equal(scope["mlp.0.fc1.w"], before["mlp.0.fc1.w"])


@pytest.mark.parametrize("make_opt", [lambda: rf.optimizer.SGD(0.1),
                                      lambda: rf.optimizer.Momentum(0.1, 0.9),
                                      lambda: rf.optimizer.Lamb(0.01)],
                         ids=["sgd", "momentum", "lamb"])
def test_every_optimizer_skips_an_overflowing_step(make_opt):
    main, startup, model, _ = build(True, make_opt=make_opt, init_loss_scaling=4.0)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, feed=model.make_batch(SEED, 0, 16), scope=scope)
    before = _state(main, scope)
    batch = model.make_batch(SEED, 1, 16)
    batch["x"][3, 2] = -1e6
    with np.errstate(invalid="ignore"):
        exe.run(main, feed=batch, scope=scope)
    for name, value in _state(main, scope).items():
        if not name.startswith(("loss_scaling", "num_")):
            np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_without_loss_scaling_amp_only_casts():
    main, *_ = build(True, init_loss_scaling=1.0, use_dynamic_loss_scaling=False)
    types = {op.type for op in main.global_block().ops}
    assert "cast" in types
    assert not types & {"check_finite_and_unscale", "update_loss_scaling", "elementwise_mul"}


def test_custom_lists_move_ops_and_may_not_overlap():
    lists = AutoMixedPrecisionLists(custom_white_list=["softmax"], custom_black_list=["relu"])
    assert "softmax" in lists.white_list and "softmax" not in lists.black_list
    assert "relu" in lists.black_list and "relu" not in lists.gray_list
    with pytest.raises(ConfigError, match="both name relu"):
        AutoMixedPrecisionLists(custom_white_list=["relu"], custom_black_list=["relu"])


def test_pure_float16_is_refused():
    with pytest.raises(ConfigError, match="use_pure_fp16"):
        decorate(rf.optimizer.SGD(0.1), use_pure_fp16=True)
