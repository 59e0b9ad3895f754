"""The fleet API: init reads the world without connecting, distributed_optimizer().minimize
applies the meta-optimizer chain Paddle's _minimize_impl would, and barrier_worker meets the
other workers. TensorParallelOptimizer's program rewrite is tested elsewhere."""

from __future__ import annotations

import logging
import socket
from typing import ClassVar

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.distributed.collective import api as collective
from ringflow.distributed.collective import rendezvous
from ringflow.distributed.fleet import DistributedOptimizer, DistributedStrategy
from ringflow.distributed.meta_optimizers import TensorParallelOptimizer
from ringflow.distributed.role_maker import PaddleCloudRoleMaker, UserDefinedRoleMaker
from ringflow.errors import ConfigError
from ringflow.framework.program import default_main_program

from .standins import AMPOptimizer, FirstInLineOptimizer, StandIn

FOUR_RANKS = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "4",
              "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:7000,10.0.0.2:7000",
              "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:7000", "PADDLE_RANK_IN_NODE": "1",
              "PADDLE_TRAINING_ROLE": "TRAINER"}


def build():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 4], dtype="float32")
        loss = rf.nn.mean(rf.nn.fc(rf.nn.relu(rf.nn.fc(x, 8)), 3))
    return main, startup, loss


def op_types(program):
    return [op.type for op in program.global_block().ops]


def strategy(tensor_parallel=False, degree=1, **features):
    s = DistributedStrategy()
    s.tensor_parallel = tensor_parallel
    s.tensor_parallel_configs = {"tensor_parallel_degree": degree}
    for name, flag in features.items():
        setattr(s, name, flag)
    return s


def minimize(opt):
    main, startup, loss = build()
    with rf.program_guard(main, startup):
        return opt.minimize(loss)


def no_socket(*args, **kwargs):
    raise AssertionError("a socket was opened")


# init and the world ------------------------------------------------------------------------
def test_init_without_env_is_a_world_of_one():
    fleet.init(is_collective=True)
    assert (fleet.worker_index(), fleet.worker_num(), fleet.node_num()) == (0, 1, 1)
    assert fleet.is_first_worker() is True and fleet.is_worker() is True
    assert fleet.worker_endpoints() == ["127.0.0.1:6170"]


def test_init_reads_the_env_contract_with_one_endpoint_per_rank(monkeypatch):
    for name, value in FOUR_RANKS.items():
        monkeypatch.setenv(name, value)
    fleet.init(is_collective=True)
    assert (fleet.worker_index(), fleet.worker_num(), fleet.node_num()) == (1, 4, 2)
    assert fleet.worker_endpoints(to_string=True) == (
        "10.0.0.1:7000,10.0.0.1:7001,10.0.0.2:7000,10.0.0.2:7001")
    assert fleet.is_first_worker() is False


def test_init_opens_no_socket_even_for_a_distributed_world(monkeypatch):
    for name, value in FOUR_RANKS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(socket, "socket", no_socket)
    fleet.init(is_collective=True)
    assert fleet.worker_num() == 4
    assert rendezvous._listener is None and collective.is_initialized() is False


def test_init_with_a_bad_env_fails_at_init_naming_the_variable(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINER_ID", "7")
    with pytest.raises(ConfigError, match="PADDLE_TRAINER_ID=7"):
        fleet.init(is_collective=True)


def test_calls_before_init_ask_for_init():
    with pytest.raises(ConfigError, match=r"call ringflow.distributed.fleet.init\(\) first"):
        fleet.Fleet().worker_num()


def test_init_again_replaces_the_role_maker():
    fleet.init(role_maker=UserDefinedRoleMaker(
        is_collective=True, current_id=1, worker_endpoints=["10.0.0.1:6170", "10.0.0.2:6170"]))
    assert (fleet.worker_index(), fleet.worker_num()) == (1, 2)
    fleet.init(is_collective=True)
    assert (fleet.worker_index(), fleet.worker_num()) == (0, 1)
    assert isinstance(fleet._role_maker(), PaddleCloudRoleMaker)


def test_the_role_maker_helper_is_none_before_init():
    assert fleet._role_maker() is None


def test_is_initialized_turns_true_at_init():
    assert fleet.is_initialized() is False
    fleet.init()
    assert fleet.is_initialized() is True


@pytest.mark.parametrize("kwargs,message", [
    ({"is_collective": "yes"}, "is_collective must be a bool"),
    ({"role_maker": "cloud"}, "role_maker must be a role maker"),
    ({"strategy": {"tensor_parallel": True}}, "strategy must be a DistributedStrategy")])
def test_init_rejects_arguments_of_the_wrong_kind(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        fleet.init(**kwargs)


# the remembered strategy -------------------------------------------------------------------
def test_init_remembers_a_copy_of_the_strategy():
    s = strategy(True, 2)
    fleet.init(is_collective=True, strategy=s)
    s.tensor_parallel_configs = {"tensor_parallel_degree": 4}
    assert fleet.get_strategy().tensor_parallel_configs["tensor_parallel_degree"] == 2


def test_without_a_strategy_get_strategy_is_none():
    fleet.init(is_collective=True)
    assert fleet.get_strategy() is None


def test_init_again_forgets_the_strategy():
    fleet.init(is_collective=True, strategy=strategy(True, 2))
    fleet.init(is_collective=True)
    assert fleet.get_strategy() is None


def test_the_strategy_of_distributed_optimizer_replaces_that_of_init():
    fleet.init(is_collective=True, strategy=strategy(True, 2))
    fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy(True, 4))
    assert fleet.get_strategy().tensor_parallel_configs["tensor_parallel_degree"] == 4


def test_distributed_optimizer_without_a_strategy_uses_that_of_init():
    fleet.init(is_collective=True, strategy=strategy(tensor_parallel=True))
    minimize(fleet.distributed_optimizer(rf.optimizer.SGD(0.1)))
    assert fleet._get_applied_meta_list() == ["TensorParallelOptimizer"]


def test_distributed_optimizer_rejects_what_is_not_an_optimizer():
    fleet.init(is_collective=True)
    with pytest.raises(ConfigError, match="str is not an optimizer"):
        fleet.distributed_optimizer("sgd")


# minimize ----------------------------------------------------------------------------------
def test_without_tensor_parallel_minimize_builds_what_the_plain_optimizer_builds():
    fleet.init(is_collective=True)
    main, startup, loss = build()
    with rf.program_guard(main, startup):
        ops, params_grads = fleet.distributed_optimizer(
            rf.optimizer.Adam(1e-3), strategy()).minimize(loss)
    plain_main, plain_startup, plain_loss = build()
    with rf.program_guard(plain_main, plain_startup):
        plain_ops, plain_params_grads = rf.optimizer.Adam(1e-3).minimize(plain_loss)
    assert op_types(main) == op_types(plain_main)
    assert op_types(startup) == op_types(plain_startup)
    assert [op.type for op in ops] == [op.type for op in plain_ops] == ["adam"] * 4
    assert len(params_grads) == len(plain_params_grads) == 4
    assert fleet._get_applied_meta_list() == []


def test_with_tensor_parallel_the_tensor_parallel_optimizer_is_applied():
    fleet.init(is_collective=True)
    minimize(fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy(tensor_parallel=True)))
    assert fleet._get_applied_meta_list() == ["TensorParallelOptimizer"]
    assert fleet._final_strategy().tensor_parallel is True


def test_tensor_parallel_needs_a_collective_fleet():
    fleet.init(is_collective=False)
    minimize(fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy(tensor_parallel=True)))
    assert fleet._get_applied_meta_list() == []


def test_a_meta_optimizer_that_cannot_apply_has_its_strategy_reset():
    fleet.init(role_maker=UserDefinedRoleMaker(  # distributed, but not collective
        is_collective=False, worker_endpoints=["10.0.0.1:6170", "10.0.0.2:6170"]))
    minimize(fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy(True, 2)))
    final = fleet._final_strategy()
    assert fleet._get_applied_meta_list() == []
    assert final.tensor_parallel is False
    assert final.tensor_parallel_configs == {"tensor_parallel_degree": 1, "tensor_init_seed": -1}


def distributed(s, *classes):
    role = PaddleCloudRoleMaker(is_collective=True, environ={})
    return DistributedOptimizer(rf.optimizer.SGD(0.1), s, role, meta_optimizer_classes=classes)


def test_an_applicable_meta_optimizer_left_out_of_the_chain_has_its_strategy_reset():
    opt = distributed(strategy(True, 2, recompute=True),
                      FirstInLineOptimizer, TensorParallelOptimizer)
    minimize(opt)
    assert opt._get_applied_meta_list() == ["FirstInLineOptimizer"]
    assert opt._final_strategy().tensor_parallel is False
    assert opt._final_strategy().tensor_parallel_configs["tensor_parallel_degree"] == 1
    assert opt._final_strategy().recompute is True


def test_minimize_leaves_the_users_strategy_as_given():
    s = strategy(True, 2, recompute=True)
    minimize(distributed(s, FirstInLineOptimizer, TensorParallelOptimizer))
    assert s.tensor_parallel is True
    assert s.tensor_parallel_configs["tensor_parallel_degree"] == 2


def test_the_chain_runs_outermost_first_down_to_the_user_optimizer():
    opt = distributed(strategy(True, amp=True), AMPOptimizer, TensorParallelOptimizer)
    ops, _ = minimize(opt)
    assert opt._get_applied_meta_list() == ["TensorParallelOptimizer", "AMPOptimizer"]
    assert [op.type for op in ops] == ["sgd"] * 4  # what the user's SGD returned


def test_strict_auto_turns_on_every_meta_optimizer_that_can_apply():
    s = DistributedStrategy()
    s.auto = True
    opt = distributed(s, AMPOptimizer, TensorParallelOptimizer)
    minimize(opt)
    assert opt._get_applied_meta_list() == ["TensorParallelOptimizer", "AMPOptimizer"]
    assert (opt._final_strategy().amp, opt._final_strategy().tensor_parallel) == (True, True)


def test_auto_with_another_option_set_turns_nothing_on():
    s = DistributedStrategy()
    s.auto = True
    s.fuse_all_reduce_ops = True
    opt = distributed(s, AMPOptimizer, TensorParallelOptimizer)
    minimize(opt)
    assert opt._get_applied_meta_list() == []


class SpyOptimizer(StandIn):
    """Records the default main program while the chain runs."""

    FEATURE = "lamb"
    seen: ClassVar[list] = []

    def minimize_impl(self, loss, *args):
        SpyOptimizer.seen.append(default_main_program())
        return super().minimize_impl(loss, *args)


def test_the_chain_sees_the_losss_program_as_the_default_main_program(monkeypatch):
    monkeypatch.setattr(SpyOptimizer, "seen", [])
    main, startup, loss = build()
    distributed(strategy(lamb=True), SpyOptimizer).minimize(loss, startup_program=startup)
    assert SpyOptimizer.seen == [main]
    assert default_main_program() is not main  # the caller's default is back


def test_minimize_logs_the_applied_chain_and_the_final_strategy(caplog):
    fleet.init(is_collective=True)
    with caplog.at_level(logging.INFO, logger="ringflow.distributed"):
        minimize(fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy(True, 1)))
    assert ("[rank 0] fleet: applied meta optimizers ['TensorParallelOptimizer']; strategy: "
            "tensor_parallel = True, tensor_parallel_configs = {'tensor_parallel_degree': 1, "
            "'tensor_init_seed': -1}") in caplog.messages


# barrier and names -------------------------------------------------------------------------
def test_barrier_in_a_world_of_one_returns_without_connecting(monkeypatch):
    fleet.init(is_collective=True)
    monkeypatch.setattr(socket, "socket", no_socket)
    fleet.barrier_worker()
    assert collective.is_initialized() is False


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_barrier_waits_for_every_worker(spawn):
    job = spawn("fleet_barrier.py", 2)
    assert job.wait(timeout=45) == [0, 0], job.output()
    endpoints = ",".join(job.endpoints)
    assert f"rank 0 of 2 endpoints {endpoints} marker seen True" in job.log(0)
    assert f"rank 1 of 2 endpoints {endpoints} marker seen True" in job.log(1)


def test_the_fleet_names_are_reachable_from_ringflow_distributed():
    assert rf.distributed.fleet is fleet
    assert rf.distributed.DistributedStrategy is fleet.DistributedStrategy
    assert rf.distributed.PaddleCloudRoleMaker is fleet.PaddleCloudRoleMaker
    assert rf.distributed.UserDefinedRoleMaker is fleet.UserDefinedRoleMaker
