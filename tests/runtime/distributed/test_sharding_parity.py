"""Sharded == unsharded (issue 19): jobs of (world, mp, sharding stage) = (2,1,1), (2,1,2),
(4,2,1), (4,2,2), (4,1,2) (the 4-rank ones on two "hosts") and plain data parallelism by
Paddle's default (2,1,0) train the MLP and the transformer with Adam, AdamW + clip and Lamb
(float64; Adam also float32) and give the per-step losses and the final parameters of one
process within rtol 1e-10 (1e-5 in float32); every rank logs the same losses bitwise and the
data-parallel replicas hold identical parameters. Meta-optimizers inside sharding (Lamb and
LARS by strategy, Recompute, AMP) in two of the jobs. Each rank holds the optimizer state of
its own parameters only.

Each configuration starts its processes once; they train every case.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.runtime.distributed import parity
from tests.runtime.distributed.sharding_cases import CASES, CONFIGS, META_CASES, META_CONFIGS

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
PAIRS = parity.pairs(CONFIGS, CASES, META_CONFIGS, META_CASES)


@pytest.fixture(scope="module")
def serial():
    """case key -> one process's losses and parameters."""
    return parity.train_each(CASES + META_CASES)


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    @functools.cache
    def get(config) -> list[dict]:
        world, mp, stage, nhosts = config
        return parity.run_ranks(tmp_path_factory.mktemp(f"shard{world}x{mp}s{stage}"),
                                "sharding_parity.py", world,
                                [str(mp), str(stage), str(nhosts)], nhosts, timeout=300)

    return get


def _ids(pair) -> str:
    (world, mp, stage, hosts), case = pair
    return f"world{world}-mp{mp}-stage{stage}" + ("-2hosts" if hosts > 1 else "") \
        + f"-{case.key}"


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_per_step_losses_equal_one_process_and_are_bitwise_equal_on_every_rank(
        serial, parallel, config, case):
    ranks = parallel(config)
    losses = np.array([r[f"{case.key}|loss"] for r in ranks])
    for r in range(1, len(ranks)):
        np.testing.assert_array_equal(losses[r], losses[0])
    np.testing.assert_allclose(losses[0], serial[case.key].losses, **case.tolerance("loss"))


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_final_parameters_gathered_equal_one_process_and_replicas_are_identical(
        serial, parallel, config, case):
    world, mp, _, _ = config
    ranks = parallel(config)
    parity.check_final(ranks, case, serial[case.key].final, world, mp)


@pytest.mark.parametrize("config", [c for c in CONFIGS if c[2] > 0],
                         ids=[f"world{c[0]}-mp{c[1]}-stage{c[2]}" for c in CONFIGS if c[2] > 0])
def test_each_rank_holds_the_optimizer_state_of_its_own_parameters_only(
        serial_state, parallel, config):
    """The ranks of a sharding group hold disjoint optimizer state (but the shared scalars:
    learning rate, AMP's scale) that together is one process's, and none more than 1/dp of
    it plus one parameter's state (parameters are never split)."""
    world, mp, _, _ = config
    dp = world // mp
    ranks = parallel(config)
    for case in CASES:
        names, per_param = serial_state[case.key]
        slack = max(per_param.values())
        for group in range(mp):
            held = [dict(zip(ranks[group + mp * d][f"{case.key}|state_names"],
                             ranks[group + mp * d][f"{case.key}|state_bytes"]))
                    for d in range(dp)]
            shared = set.intersection(*(set(h) for h in held))
            assert shared <= SCALARS, (case.key, shared)
            assert set().union(*held) == names, case.key
            total = sum(b for h in held for n, b in h.items() if n not in shared)
            for h in held:
                mine = sum(b for n, b in h.items() if n not in shared)
                assert mine <= total / dp + slack, (case.key, mine, total)


@pytest.mark.parametrize("config", [c for c in CONFIGS if c[2] > 0],
                         ids=[f"world{c[0]}-mp{c[1]}-stage{c[2]}" for c in CONFIGS if c[2] > 0])
def test_the_fused_update_updates_the_gathered_parameters_where_they_lie(parallel, config):
    """Sharded, fused: the parameters are views of the all-gather's one buffer, and the
    fused update steps' parameter storage is that buffer (no copy either way per step).
    Not so for Lamb under tensor parallelism: its updates of sharded and of replicated
    parameters differ (the mp ring_id), so two fused steps each hold their own storage."""
    for rank in parallel(config):
        for case in CASES:
            if config[1] > 1 and case.optimizer == "lamb":
                continue
            assert rank[f"{case.key}|one_buffer"].tolist() is True, case.key


SCALARS = {"learning_rate_0", "loss_scaling_0", "num_good_steps_0", "num_bad_steps_0"}


@pytest.fixture(scope="module")
def serial_state():
    """case key -> (optimizer-state variable names, state bytes per parameter) of the
    serial programs (names are the same at every degree)."""
    found = {}
    for case in CASES:
        main, _, _ = parity.serial_build(case)
        block = main.global_block()
        params = [p.name for p in main.all_parameters()]
        state = [v for v in block.vars.values() if v.persistable and v.name not in params]
        per_param = {p: sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in state
                            if v.name.startswith(p + "_")) for p in params}
        found[case.key] = ({v.name for v in state}, per_param)
    return found
