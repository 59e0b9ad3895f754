"""Strategy options that change what fleet builds, read from the programs (no peers
needed): gradient_scale_configs' scale_strategy (avg scales the loss gradient by 1/dp; sum
and customized do not), build_strategy and the fusion options (the BuildStrategy the
executor runs fleet's main program with), gradient_merge (its ops, and the ConfigErrors of
what it does not combine with), fp16_allreduce (the casts around each gradient all-reduce;
its results: test_fleet_compat_parity.py)."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.distributed.role_maker import UserDefinedRoleMaker
from ringflow.distributed.strategy import DistributedStrategy
from ringflow.errors import ConfigError
from ringflow.executor import _program_and_strategy
from ringflow.framework.roles import is_loss_grad_op


def _minimize(strategy, world=2, optimizer=None):
    fleet.init(role_maker=UserDefinedRoleMaker(
        is_collective=True, current_id=0,
        worker_endpoints=[f"10.0.0.{i + 1}:6170" for i in range(world)]))
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 4], dtype="float64")
        loss = rf.nn.mean(rf.nn.fc(x, 3))
        fleet.distributed_optimizer(optimizer or rf.optimizer.SGD(0.1), strategy).minimize(loss)
    return main, startup


def _loss_grad_scales(main) -> list[float]:
    ops = main.global_block().ops
    first = next(i for i, op in enumerate(ops) if is_loss_grad_op(op))
    return [op.attr("scale") for op in ops[first + 1:first + 2] if op.type == "scale"]


@pytest.mark.parametrize("scale_strategy, expected", [("avg", [0.5]), ("sum", []),
                                                      ("customized", [])])
@pytest.mark.parametrize("tensor_parallel", [False, True])
def test_the_loss_gradient_is_scaled_by_1_over_dp_only_for_avg(scale_strategy, expected,
                                                              tensor_parallel):
    s = DistributedStrategy()
    s.tensor_parallel = tensor_parallel
    s.gradient_scale_configs = {"scale_strategy": scale_strategy}
    main, _ = _minimize(s)
    assert _loss_grad_scales(main) == expected


def test_fleets_main_program_runs_with_the_strategys_build_strategy():
    s = DistributedStrategy()
    s.build_strategy = rf.BuildStrategy(fuse_gemm_epilogue=False)
    s.fuse_all_reduce_ops = False
    s.fuse_grad_size_in_MB = 4
    main, _ = _minimize(s)
    expected = rf.BuildStrategy(fuse_gemm_epilogue=False, fuse_all_reduce_ops=False,
                                fuse_grad_size_in_MB=4.0)
    assert main.build_strategy == expected
    assert _program_and_strategy(main) == (main, expected)


def test_a_default_strategy_leaves_the_executors_default():
    main, _ = _minimize(DistributedStrategy())
    assert main.build_strategy is None
    assert _program_and_strategy(main)[1] == rf.BuildStrategy()


def test_a_compiled_program_keeps_its_own_build_strategy():
    s = DistributedStrategy()
    s.fuse_all_reduce_ops = False
    main, _ = _minimize(s)
    own = rf.BuildStrategy(fuse_gemm_epilogue=False)
    assert _program_and_strategy(rf.CompiledProgram(main, own))[1] == own


def test_gradient_merge_brackets_the_optimizer_section():
    s = DistributedStrategy()
    s.gradient_merge = True
    s.gradient_merge_configs = {"k_steps": 4, "avg": False}
    main, startup = _minimize(s, world=1)
    types = [op.type for op in main.global_block().ops]
    first = types.index("gradient_merge_step")
    assert types[first + 1:first + 3] == ["elementwise_add", "scale"]
    assert types.index("skip_update_begin") < types.index("sgd") < types.index(
        "skip_update_end") < types.index("gradient_merge_clear") == len(types) - 1
    scales = [op.attr("scale") for op in main.global_block().ops[first:] if op.type == "scale"]
    assert set(scales) == {1.0} and main.runs_per_step == 4
    sgd = next(op for op in main.global_block().ops if op.type == "sgd")
    assert sgd.input("Grad")[0].endswith("@GRAD@GradientMerge@MERGED")
    assert "gradient_merge_step" in startup.global_block().vars
    assert fleet._get_applied_meta_list()[0] == "GradientMergeOptimizer"


def test_gradient_merge_of_one_step_changes_nothing():
    s = DistributedStrategy()
    s.gradient_merge = True
    main, _ = _minimize(s, world=1)
    assert "gradient_merge_step" not in [op.type for op in main.global_block().ops]


@pytest.mark.parametrize("other", ["sharding", "amp"])
def test_gradient_merge_with_sharding_or_amp_is_a_config_error(other):
    s = DistributedStrategy()
    s.gradient_merge = True
    s.gradient_merge_configs = {"k_steps": 2}
    setattr(s, other, True)
    with pytest.raises(ConfigError, match=f"gradient_merge with {other} is not supported"):
        _minimize(s)


@pytest.mark.parametrize("tensor_parallel", [False, True])
def test_fp16_allreduce_moves_each_float32_gradient_as_float16(tensor_parallel):
    s = DistributedStrategy()
    s.fp16_allreduce = True
    s.tensor_parallel = tensor_parallel
    fleet.init(role_maker=UserDefinedRoleMaker(
        is_collective=True, current_id=0, worker_endpoints=["10.0.0.1:6170", "10.0.0.2:6170"]))
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 4], dtype="float32")
        loss = rf.nn.mean(rf.nn.fc(x, 3))
        fleet.distributed_optimizer(rf.optimizer.SGD(0.1), s).minimize(loss)
    block = main.global_block()
    allreduces = [op for op in block.ops if op.type == "c_allreduce_sum"]
    assert len(allreduces) == 2
    for op in allreduces:
        half = op.input("X")[0]
        assert half.endswith("@GRAD@FP16") and block.var(half).dtype == "float16"
        i = block.index_of(op)
        before, after = block.ops[i - 1], block.ops[i + 1]
        assert (before.type, before.input("X"), before.output("Out")) == (
            "cast", [half.removesuffix("@FP16")], [half])
        assert (after.type, after.input("X"), after.output("Out")) == (
            "cast", [half], [half.removesuffix("@FP16")])


def test_fp16_allreduce_with_sharding_is_a_config_error():
    s = DistributedStrategy()
    s.fp16_allreduce = True
    s.sharding = True
    with pytest.raises(ConfigError, match="fp16_allreduce with sharding is not supported"):
        _minimize(s)
