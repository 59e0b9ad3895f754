"""Paddle-form strategies (issue 22) train as one process does: degrees set through
``hybrid_configs`` (dp x mp, and sharding_degree over the data-parallel ranks) and
``gradient_merge`` (K micro-steps of batch B/K per step == one step of batch B, SGD and
Adam, float64) at (world, mp) = (2,1), (2,2), (4,2) on two "hosts" give the per-step losses
and final parameters of one process within rtol 1e-10; data-parallel replicas hold
identical parameters; fp16_allreduce (float32, SGD) within float16 rounding. Each
configuration starts its processes once (and once more for the sharding case); they train
every case.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.runtime.distributed import parity
from tests.runtime.distributed.fleet_compat_cases import CONFIGS, cases
from tests.runtime.distributed.tp_cases import build_programs

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
PAIRS = [(config, case) for config in CONFIGS for case in cases(*config)]
APPLIED = {"hybrid": {1: ["GraphExecutionOptimizer"], 2: ["TensorParallelOptimizer"]},
           "sharding": {1: ["ShardingOptimizer"], 2: ["ShardingOptimizer"]},
           "merge": {1: ["GradientMergeOptimizer", "GraphExecutionOptimizer"],
                     2: ["GradientMergeOptimizer", "TensorParallelOptimizer"]},
           "fp16": {1: ["GraphExecutionOptimizer"], 2: ["TensorParallelOptimizer"]}}


@pytest.fixture(scope="module")
def serial():
    """case key -> one process's per-step losses and parameters, one step per batch."""
    return parity.train_each({c.key: c for _, c in PAIRS}.values(),
                             lambda case: build_programs(case, mp_degree=1))


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    @functools.cache
    def get(config) -> list[dict]:
        world, mp = config
        ranks: list[dict] = [{} for _ in range(world)]
        kinds = ["others"] + ["sharding"] * any(c.form == "sharding" for c in cases(*config))
        for kind in kinds:
            found = parity.run_ranks(tmp_path_factory.mktemp(f"compat{world}x{mp}{kind}"),
                                     "fleet_compat.py", world, [str(mp), kind], 2, timeout=300)
            for rank, results in zip(ranks, found):
                rank.update(results)
        return ranks

    return get


def _ids(pair) -> str:
    (world, mp), case = pair
    return f"world{world}-mp{mp}-2hosts-{case.key}"


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_the_strategy_runs_the_meta_optimizers_its_degrees_ask_for(parallel, config, case):
    _, mp = config
    for rank in parallel(config):
        assert rank[f"{case.key}|applied"].tolist() == APPLIED[case.form][min(mp, 2)]


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_per_step_losses_equal_one_process(serial, parallel, config, case):
    """The loss of a step is the mean of its micro-steps' losses over the data-parallel
    ranks (equal rows each; the parameters do not change between micro-steps)."""
    _, mp = config
    ranks = parallel(config)
    per_rank = np.array([r[f"{case.key}|loss"] for r in ranks])   # rank x step x micro
    losses = per_rank[::mp].mean(axis=(0, 2))
    np.testing.assert_allclose(losses, serial[case.key].losses, **case.tolerance("loss"))


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_final_parameters_equal_one_process_and_replicas_are_identical(
        serial, parallel, config, case):
    world, mp = config
    ranks = parallel(config)
    parity.check_final(ranks, case, serial[case.key].final, world, mp)


@pytest.mark.parametrize("find_unused", ["0", "1"])
def test_a_parameter_without_gradient_does_not_hang_data_parallel_training(tmp_path,
                                                                           find_unused):
    """find_unused_parameters either way: a parameter the loss does not use has no gradient
    on any rank, so no all-reduce waits for it; the job ends, the parameter keeps its start
    value and the replicas agree."""
    ranks = parity.run_ranks(tmp_path, "unused_param.py", 2, [find_unused, "unset"], 2,
                             timeout=120, check_shm=False)
    for rank in ranks:
        np.testing.assert_array_equal(rank["unused"], rank["start"])
    np.testing.assert_array_equal(ranks[0]["used"], ranks[1]["used"])
    np.testing.assert_array_equal(ranks[0]["unused"], ranks[1]["unused"])


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """hierarchical ("on", "off", "unset") -> the ranks' results of a data-parallel job of 4
    ranks on two hosts (two ranks each)."""
    return {hierarchical: parity.run_ranks(tmp_path_factory.mktemp(f"hier-{hierarchical}"),
                                           "unused_param.py", 4, ["0", hierarchical], 2,
                                           timeout=120, check_shm=False)
            for hierarchical in ("on", "off", "unset")}


@pytest.mark.parametrize("hierarchical, algorithm", [("on", "two-level"), ("off", "ring"),
                                                     ("unset", "two-level")])
def test_use_hierarchical_allreduce_chooses_two_levels_or_one_ring(four_ranks, hierarchical,
                                                                   algorithm):
    """Set, the option chooses; not set, ringflow's default (two levels: shared memory inside
    a host, one TCP ring between hosts). The parameters agree either way."""
    ranks = four_ranks[hierarchical]
    assert [str(r["algorithm"]) for r in ranks] == [algorithm] * 4
    for rank in ranks[1:]:
        np.testing.assert_array_equal(rank["used"], ranks[0]["used"])
    np.testing.assert_allclose(ranks[0]["used"], four_ranks["off"][0]["used"], rtol=1e-12)
