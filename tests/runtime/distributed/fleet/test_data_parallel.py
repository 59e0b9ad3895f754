"""Data parallelism as Paddle's default: a collective fleet of more than one rank whose
strategy sets neither tensor_parallel nor sharding still all-reduces every gradient
(GraphExecutionOptimizer, the graph optimizer at the end of the chain, in the program form
of Paddle's RawProgramOptimizer: ring 0 over every rank). Programs are built only here;
tests/runtime/distributed/test_sharding_parity.py trains them."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.distributed.fleet import DistributedStrategy
from ringflow.framework.roles import OP_ROLE_KEY, OpRole
from ringflow.models import mlp
from tests.runtime.distributed.fleet.test_meta_optimizers import join, ops_of


def build(s: DistributedStrategy, make_opt=lambda: rf.optimizer.Adam(0.01)):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = mlp(input_size=8, hidden_size=16, num_classes=4, num_layers=2)
        result = fleet.distributed_optimizer(make_opt(), s).minimize(model.loss)
    rf.verify(main)
    rf.verify(startup)
    return main, startup, result


def test_a_strategy_without_parallel_features_all_reduces_every_gradient_on_ring_0(monkeypatch):
    join(4, 1, monkeypatch)
    main, startup, (ops, params_grads) = build(DistributedStrategy())
    assert fleet._get_applied_graph_list() == ["GraphExecutionOptimizer"]
    assert fleet._get_applied_meta_list() == []
    grads = sorted(g.name for _, g in params_grads)
    allreduces = ops_of(main, "c_allreduce_sum")
    assert sorted(op.input("X")[0] for op in allreduces) == grads
    assert {op.attr("ring_id") for op in allreduces} == {0}
    assert all(op.attr(OP_ROLE_KEY) == OpRole.Backward for op in allreduces)
    scale, = ops_of(main, "scale")
    assert scale.attr("scale") == pytest.approx(0.25)
    assert [op.type for op in ops] == ["adam"] * len(params_grads)   # the chain's result
    init, = ops_of(startup, "c_comm_init")
    assert (init.attr("ring_id"), init.attr("rank"), init.attr("nranks")) == (0, 1, 4)
    broadcasts = ops_of(startup, "broadcast")
    assert sorted(op.input("X")[0] for op in broadcasts) == sorted(
        p.name for p, _ in params_grads)
    assert {(op.attr("ring_id"), op.attr("root")) for op in broadcasts} == {(0, 0)}


def test_every_gradient_is_reduced_before_the_first_update(monkeypatch):
    join(2, 0, monkeypatch)
    main, _, _ = build(DistributedStrategy())
    types = [op.type for op in main.global_block().ops]
    first_update = types.index("adam")
    assert types.index("c_sync_comm_stream") == first_update - 1
    last_allreduce = max(i for i, t in enumerate(types) if t == "c_allreduce_sum")
    assert last_allreduce < first_update


def test_with_amp_the_found_inf_flag_is_reduced_over_ring_0(monkeypatch):
    join(2, 0, monkeypatch)
    s = DistributedStrategy()
    s.amp = True
    main, _, _ = build(s, lambda: rf.optimizer.SGD(0.1))
    assert fleet._get_applied_meta_list() == ["AMPOptimizer"]
    flag, = ops_of(main, "c_allreduce_max")
    assert flag.attr("ring_id") == 0
    assert {main.global_block().var(op.input("X")[0]).dtype
            for op in ops_of(main, "c_allreduce_sum")} >= {"float16"}


def test_one_rank_or_a_non_collective_fleet_gets_no_data_parallel_rewrite(monkeypatch):
    fleet.init(is_collective=True)                       # a world of one
    main, startup, _ = build(DistributedStrategy())
    assert fleet._get_applied_graph_list() == []
    assert not ops_of(main, "c_allreduce_sum") and not ops_of(startup, "c_comm_init")


@pytest.mark.parametrize("feature", ["tensor_parallel", "sharding"])
def test_tensor_parallel_and_sharding_data_parallelise_by_themselves(feature, monkeypatch):
    join(2, 0, monkeypatch)
    s = DistributedStrategy()
    setattr(s, feature, True)
    build(s)
    assert fleet._get_applied_graph_list() == []
