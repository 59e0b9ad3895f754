"""The meta-optimizers of TensorParallelOptimizer's white list, real (Paddle's
amp/recompute/lamb/lars_optimizer.py): when each applies, the chain they form, what each
puts into the programs (built only, never run: fleet.init opens no connection), and how
the tensor-parallel rewrite composes with them (float16 gradient all-reduces, the found-inf
flag reduced over the rings)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.distributed.fleet import DistributedStrategy
from ringflow.distributed.meta_optimizers import (
    AMPOptimizer,
    LambOptimizer,
    LarsOptimizer,
    RecomputeOptimizer,
    TensorParallelOptimizer,
)
from ringflow.errors import ConfigError
from ringflow.framework.roles import OP_ROLE_KEY, OpRole
from ringflow.models import mlp


def join(world: int, rank: int, monkeypatch) -> None:
    endpoints = ",".join(f"127.0.0.1:{7000 + r}" for r in range(world))
    for name, value in {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world),
                        "PADDLE_TRAINER_ENDPOINTS": endpoints,
                        "PADDLE_TRAINING_ROLE": "TRAINER"}.items():
        monkeypatch.setenv(name, value)
    fleet.init(is_collective=True)


def strategy(degree: int = 1, **features) -> DistributedStrategy:
    s = DistributedStrategy()
    s.tensor_parallel = True
    s.tensor_parallel_configs = {"tensor_parallel_degree": degree}
    for name, value in features.items():
        setattr(s, name, value)
    return s


def build(s: DistributedStrategy, make_opt=lambda: rf.optimizer.Adam(0.01), mp_degree=1):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = mlp(input_size=8, hidden_size=16, num_classes=4, num_layers=3,
                    mp_degree=mp_degree)
        fleet.distributed_optimizer(make_opt(), s).minimize(model.loss)
    rf.verify(main)
    rf.verify(startup)
    return main, startup, model


def ops_of(program, op_type):
    return [op for op in program.global_block().ops if op.type == op_type]


# when each applies, and the chain -------------------------------------------------------------
def test_the_white_lists_are_paddles():
    user = rf.optimizer.Adam()
    assert TensorParallelOptimizer(user).meta_optimizers_white_list == [
        "RecomputeOptimizer", "AMPOptimizer", "LarsOptimizer", "LambOptimizer"]
    assert AMPOptimizer(user).meta_optimizers_white_list == [
        "LarsOptimizer", "LambOptimizer", "RecomputeOptimizer", "GraphExecutionOptimizer"]
    assert AMPOptimizer(user).meta_optimizers_black_list == ["DGCOptimizer"]
    assert RecomputeOptimizer(user).meta_optimizers_white_list == [
        "LarsOptimizer", "LambOptimizer", "GraphExecutionOptimizer", "DGCOptimizer"]
    assert LambOptimizer(user).meta_optimizers_white_list == []
    assert LarsOptimizer(user).meta_optimizers_white_list == ["GraphExecutionOptimizer"]


def test_tensor_parallel_wraps_amp_recompute_and_lamb_around_the_users_adam():
    fleet.init(is_collective=True)
    model_ckpts = ["relu.tmp_5", "relu.tmp_11"]
    build(strategy(amp=True, recompute=True, recompute_configs={"checkpoints": model_ckpts},
                   lamb=True))
    assert fleet._get_applied_meta_list() == [
        "TensorParallelOptimizer", "AMPOptimizer", "RecomputeOptimizer", "LambOptimizer"]


def test_lars_is_the_innermost_with_the_users_momentum():
    fleet.init(is_collective=True)
    build(strategy(amp=True, lars=True), lambda: rf.optimizer.Momentum(0.1, 0.9))
    assert fleet._get_applied_meta_list() == [
        "TensorParallelOptimizer", "AMPOptimizer", "LarsOptimizer"]


@pytest.mark.parametrize("feature, make_opt, wanted", [
    ("lamb", lambda: rf.optimizer.SGD(0.1), "lamb needs the inner optimizer to be Adam, got sgd"),
    ("lamb", lambda: rf.optimizer.Lamb(0.1), "to be Adam, got lamb"),
    ("lars", lambda: rf.optimizer.Adam(0.1), "lars needs the inner optimizer to be Momentum"),
])
def test_lamb_and_lars_need_their_inner_optimizer_and_say_so(caplog, feature, make_opt,
                                                            wanted):
    fleet.init(is_collective=True)
    with caplog.at_level(logging.WARNING, logger="ringflow.distributed"):
        build(strategy(**{feature: True}), make_opt)
    assert fleet._get_applied_meta_list() == ["TensorParallelOptimizer"]
    assert any(wanted in m for m in caplog.messages)
    assert getattr(fleet._final_strategy(), feature) is False


def test_recompute_without_checkpoints_does_not_apply():
    fleet.init(is_collective=True)
    build(strategy(recompute=True))
    assert fleet._get_applied_meta_list() == ["TensorParallelOptimizer"]
    assert fleet._final_strategy().recompute is False


def test_strict_auto_enables_amp_and_lamb_but_not_recompute():
    fleet.init(is_collective=True)
    s = DistributedStrategy()
    s.auto = True
    build(s)
    assert fleet._get_applied_meta_list() == [
        "TensorParallelOptimizer", "AMPOptimizer", "LambOptimizer"]
    final = fleet._final_strategy()
    assert (final.amp, final.lamb, final.recompute, final.lars) == (True, True, False, False)


@pytest.mark.parametrize("cls, feature", [(AMPOptimizer, "amp"), (LambOptimizer, "lamb"),
                                          (LarsOptimizer, "lars"),
                                          (RecomputeOptimizer, "recompute")])
def test_disable_strategy_turns_the_feature_off_and_its_configs_back_to_defaults(cls, feature):
    s = strategy(**{feature: True})
    configs = f"{feature}_configs"
    changed = {"amp": {"init_loss_scaling": 8.0}, "lamb": {"lamb_weight_decay": 0.5},
               "lars": {"lars_coeff": 0.5}, "recompute": {"checkpoints": ["h"]}}[feature]
    setattr(s, configs, changed)
    cls(rf.optimizer.Adam())._disable_strategy(s)
    assert getattr(s, feature) is False
    assert getattr(s, configs) == getattr(DistributedStrategy(), configs)


# Lamb and Lars ------------------------------------------------------------------------------
def test_lamb_trains_the_adam_with_the_strategys_decay_and_exclusions():
    fleet.init(is_collective=True)
    s = strategy(lamb=True, lamb_configs={"lamb_weight_decay": 0.05,
                                          "exclude_from_weight_decay": [".b"]})
    main, startup, _ = build(s, lambda: rf.optimizer.Adam(0.02, beta1=0.8, beta2=0.99,
                                                          epsilon=1e-7))
    updates = ops_of(main, "lamb")
    assert len(updates) == 12 and not ops_of(main, "adam")
    for op in updates:
        assert (op.attr("beta1"), op.attr("beta2"), op.attr("epsilon")) == (0.8, 0.99, 1e-7)
        decayed = not op.input("Param")[0].endswith(".b")     # Paddle: endswith
        assert op.attr("weight_decay") == (0.05 if decayed else 0.0)
    lr = [op for op in ops_of(startup, "fill_constant")
          if op.output("Out")[0].startswith("learning_rate")]
    assert [op.attr("value") for op in lr] == [0.02]


def test_lars_trains_the_momentum_with_the_strategys_coefficients_and_exclusions():
    fleet.init(is_collective=True)
    s = strategy(lars=True, lars_configs={"lars_coeff": 0.02, "lars_weight_decay": 0.001,
                                          "epsilon": 1e-9, "exclude_from_weight_decay": ["fc2"]})
    main, *_ = build(s, lambda: rf.optimizer.Momentum(0.1, momentum=0.8))
    updates = ops_of(main, "lars_momentum")
    assert len(updates) == 12 and not ops_of(main, "momentum")
    for op in updates:
        decayed = "fc2" not in op.input("Param")[0]           # Paddle: contains
        assert (op.attr("mu"), op.attr("lars_coeff"), op.attr("epsilon")) == (0.8, 0.02, 1e-9)
        assert op.attr("lars_weight_decay") == (0.001 if decayed else 0.0)


def test_lamb_under_model_parallelism_takes_whole_parameter_norms(monkeypatch):
    join(2, 0, monkeypatch)
    main, *_ = build(strategy(2, lamb=True), mp_degree=2)
    sharded = [op.attr("ring_id") for op in ops_of(main, "lamb")
               if main.global_block().var(op.input("Param")[0]).is_distributed]
    assert sharded and set(sharded) == {0}


# AMP under tensor parallelism ---------------------------------------------------------------
def _allreduced(main, ring: int) -> list:
    block = main.global_block()
    return [block.var(op.input("X")[0]) for op in ops_of(main, "c_allreduce_sum")
            if op.attr("ring_id") == ring and int(op.attr(OP_ROLE_KEY)) == OpRole.Backward]


def test_amp_under_data_parallelism_all_reduces_float16_gradients_half_the_bytes(monkeypatch):
    join(2, 0, monkeypatch)
    plain, *_ = build(strategy())
    amp, *_ = build(strategy(amp=True))
    nbytes = {name: sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                        for v in _allreduced(program, 2))
              for name, program in (("plain", plain), ("amp", amp))}
    assert {v.dtype for v in _allreduced(amp, 2)} == {"float16"}
    assert len(_allreduced(amp, 2)) == len(_allreduced(plain, 2)) == 12
    assert nbytes["amp"] * 2 == nbytes["plain"]


@pytest.mark.parametrize("world, degree, rings", [(2, 1, [2]), (2, 2, [0]), (4, 2, [0, 2])])
def test_the_found_inf_flag_is_reduced_by_max_over_the_mp_and_dp_rings(
        monkeypatch, world, degree, rings):
    join(world, 0, monkeypatch)
    main, *_ = build(strategy(degree, amp=True), mp_degree=degree)
    block = main.global_block()
    check = ops_of(main, "check_finite_and_unscale")[0]
    found = check.output("FoundInfinite")[0]
    at = block.index_of(check)
    after = block.ops[at + 1: at + 3 + len(rings)]
    assert [op.type for op in after] == ["cast", *["c_allreduce_max"] * len(rings), "cast"]
    assert [op.attr("ring_id") for op in after[1:-1]] == rings
    assert after[0].input("X") == [found] and after[-1].output("Out") == [found]
    assert after[0].output("Out") == [f"{found}@cast_int32"]
    assert {int(op.attr(OP_ROLE_KEY)) for op in after} == {int(OpRole.Optimize)}
    assert block.ops[at + 3 + len(rings)].type == "update_loss_scaling"


def test_one_process_amp_reduces_no_flag():
    fleet.init(is_collective=True)
    main, *_ = build(strategy(amp=True))
    assert not ops_of(main, "c_allreduce_max")


def test_amp_configs_reach_the_programs():
    fleet.init(is_collective=True)
    s = strategy(amp=True, amp_configs={"init_loss_scaling": 128.0, "incr_every_n_steps": 7,
                                        "decr_every_n_nan_or_inf": 3, "incr_ratio": 3.0,
                                        "decr_ratio": 0.25})
    main, startup, _ = build(s)
    update = ops_of(main, "update_loss_scaling")[0]
    assert [update.attr(k) for k in ("incr_every_n_steps", "decr_every_n_nan_or_inf",
                                     "incr_ratio", "decr_ratio")] == [7, 3, 3.0, 0.25]
    fill = [op for op in ops_of(startup, "fill_constant")
            if op.output("Out") == ["loss_scaling_0"]]
    assert fill[0].attr("value") == 128.0


def test_amp_without_dynamic_scaling_keeps_the_static_scale_and_has_no_update():
    fleet.init(is_collective=True)
    main, *_ = build(strategy(amp=True, amp_configs={"use_dynamic_loss_scaling": False,
                                                      "init_loss_scaling": 64.0}))
    assert ops_of(main, "check_finite_and_unscale") and not ops_of(main, "update_loss_scaling")


# Recompute ----------------------------------------------------------------------------------
def test_recompute_by_strategy_recomputes_and_dp_still_all_reduces_every_gradient(monkeypatch):
    join(2, 0, monkeypatch)
    main, _, model = build(strategy())
    checkpoints = list(model.checkpoints)
    recomputed, _, _ = build(strategy(recompute=True,
                                      recompute_configs={"checkpoints": checkpoints}))
    assert fleet._get_applied_meta_list() == ["TensorParallelOptimizer", "RecomputeOptimizer"]
    copies = [op for op in recomputed.global_block().ops if op.type == "matmul_v2"
              and int(op.attr(OP_ROLE_KEY)) == OpRole.Backward]
    assert len(copies) == 2 * len(checkpoints)
    assert sorted(v.name for v in _allreduced(recomputed, 2)) == sorted(
        v.name for v in _allreduced(main, 2))


def test_recompute_offload_is_refused():
    fleet.init(is_collective=True)
    s = strategy(recompute=True, recompute_configs={"checkpoints": ["relu.tmp_5"],
                                                    "enable_offload": True})
    with pytest.raises(ConfigError, match="enable_offload"):
        build(s)
