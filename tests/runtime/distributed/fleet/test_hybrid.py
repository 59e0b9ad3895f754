"""hybrid_configs mapped onto what ringflow runs: mp_degree -> tensor parallelism,
sharding_degree -> sharding over the data-parallel ranks, dp_degree (-1: inferred) -> data
parallelism; pipeline, sequence, context and expert degrees > 1 are ConfigErrors naming
what is not supported; the degrees' product must be the world. (The trained results equal
one process's: test_fleet_compat_parity.py.)"""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.distributed.hybrid import hybrid_degrees
from ringflow.distributed.role_maker import UserDefinedRoleMaker
from ringflow.distributed.strategy import DistributedStrategy
from ringflow.errors import ConfigError


def hybrid(**configs) -> DistributedStrategy:
    s = DistributedStrategy()
    s.hybrid_configs = configs
    return s


@pytest.mark.parametrize("configs,world,expected", [
    ({"dp_degree": 2}, 2, (2, 1, 1)),
    ({"mp_degree": 2}, 4, (2, 2, 1)),            # dp -1: inferred
    ({"dp_degree": 2, "mp_degree": 2}, 4, (2, 2, 1)),
    ({"sharding_degree": 2, "mp_degree": 2, "dp_degree": 1}, 4, (1, 2, 2)),
    ({"mp_degree": 1, "pp_degree": 1}, 3, (3, 1, 1)),
])
def test_degrees_of_the_world(configs, world, expected):
    d = hybrid_degrees(hybrid(**configs), world)
    assert (d.dp, d.mp, d.sharding) == expected


def test_no_hybrid_configs_given_asks_no_degrees():
    assert hybrid_degrees(DistributedStrategy(), 4) is None


@pytest.mark.parametrize("key,what", [("pp_degree", "pipeline parallelism"),
                                      ("sep_degree", "sequence parallelism"),
                                      ("cp_degree", "context parallelism"),
                                      ("ep_degree", "expert parallelism")])
def test_an_unsupported_degree_above_1_names_what_is_not_supported(key, what):
    with pytest.raises(ConfigError, match=f"hybrid_configs\\['{key}'\\]=2: {what} is not "
                                          "supported by ringflow"):
        hybrid_degrees(hybrid(**{key: 2, "dp_degree": 1}), 2)


@pytest.mark.parametrize("configs,world,message", [
    ({"dp_degree": 2, "mp_degree": 2}, 2, "dp_degree=2 x mp_degree=2 x sharding_degree=1 = 4 "
                                          "must be the world size 2"),
    ({"mp_degree": 3}, 4, "mp_degree=3 x sharding_degree=1 does not divide the world size 4"),
    ({"sharding_degree": 2, "dp_degree": 2}, 4, "ringflow's sharding groups are all the "
                                                "data-parallel ranks"),
])
def test_degrees_that_do_not_fit_the_world_are_config_errors(configs, world, message):
    with pytest.raises(ConfigError, match=message):
        hybrid_degrees(hybrid(**configs), world)


def test_an_order_with_dp_inside_mp_is_refused():
    s = hybrid(dp_degree=2, mp_degree=2, order=["mp", "pp", "sharding", "sep", "cp", "dp"])
    with pytest.raises(ConfigError, match="'dp' inside 'mp' is not supported"):
        hybrid_degrees(s, 4)


def test_an_order_is_free_where_a_degree_is_1():
    s = hybrid(dp_degree=2, mp_degree=1, order=["mp", "pp", "sharding", "sep", "cp", "dp"])
    assert hybrid_degrees(s, 2).dp == 2


def _applied(strategy, world=2):
    fleet.init(role_maker=UserDefinedRoleMaker(
        is_collective=True, current_id=0,
        worker_endpoints=[f"10.0.0.{i + 1}:6170" for i in range(world)]))
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 4], dtype="float32")
        h = rf.distributed.split(x, size=(4, 8), operation="linear", axis=1,
                                 num_partitions=strategy._mp_degree() or 1, gather_out=True)
        loss = rf.nn.mean(h)
        opt = fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy)
        opt.minimize(loss)
    return fleet._get_applied_meta_list() + fleet._get_applied_graph_list(), \
        fleet._final_strategy()


def test_mp_degree_runs_tensor_parallelism_of_that_degree():
    applied, final = _applied(hybrid(mp_degree=2, dp_degree=2), world=4)
    assert applied == ["TensorParallelOptimizer"]
    assert final.tensor_parallel_configs["tensor_parallel_degree"] == 2


def test_dp_degree_alone_runs_plain_data_parallelism():
    applied, _ = _applied(hybrid(dp_degree=2))
    assert applied == ["GraphExecutionOptimizer"]


def test_sharding_degree_runs_sharding_with_the_mp_degree_inside():
    applied, final = _applied(hybrid(sharding_degree=2, mp_degree=2, dp_degree=1), world=4)
    assert applied == ["ShardingOptimizer"]
    assert (final.sharding_configs["sharding_degree"], final.sharding_configs["mp_degree"]) \
        == (2, 2)


def test_the_users_strategy_is_left_as_given():
    s = hybrid(mp_degree=2)
    _applied(s)
    assert s.tensor_parallel is False and fleet.get_strategy().tensor_parallel is False


def test_a_different_tensor_parallel_degree_is_a_config_error():
    s = hybrid(mp_degree=2)
    s.tensor_parallel = True
    s.tensor_parallel_configs = {"tensor_parallel_degree": 1}
    with pytest.raises(ConfigError, match="hybrid_configs\\['mp_degree'\\]=2 differs from "
                                          "tensor_parallel_configs"):
        _applied(s)


def test_hybrid_degrees_are_checked_at_init():
    with pytest.raises(ConfigError, match="pipeline parallelism is not supported"):
        fleet.init(role_maker=UserDefinedRoleMaker(
            is_collective=True, current_id=0, worker_endpoints=["a:1", "b:1"]),
            strategy=hybrid(pp_degree=2, dp_degree=1))


def test_parallel_layers_read_the_mp_degree_of_hybrid_configs():
    assert hybrid(mp_degree=4)._mp_degree() == 4
