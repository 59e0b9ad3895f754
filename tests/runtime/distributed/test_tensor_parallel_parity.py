"""Parallel == serial: the MLP and the transformer trained with SGD, Adam (clipped), Lamb
and LARS by tensor-parallel + data-parallel jobs give the per-step losses and, gathered, the
final parameters of one process (rtol 1e-10 in float64, 1e-5 in float32), and every shard
after startup is bitwise the slice of the serial parameter (DESIGN.md section 8). The
meta-optimizers of the tensor-parallel white list (Lamb and LARS by strategy, Recompute:
rtol 1e-10 in float64; AMP: float16 tolerances) give those of one process running the same
meta-optimizer, in the (2, 2) and (2, 1) jobs.

Each (world, degree) starts its processes once; they train every case (tp_cases.CASES and,
in META_CONFIGS, META_CASES) and write their results; the serial reference is trained
here, once per case.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.runtime.distributed import parity
from tests.runtime.distributed.tp_cases import CASES, CONFIGS, META_CASES, META_CONFIGS

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

PAIRS = parity.pairs(CONFIGS, CASES, META_CONFIGS, META_CASES)


@pytest.fixture(scope="module")
def serial():
    """case key -> one process's losses, parameters after startup and after the last step."""
    return parity.train_each(CASES + META_CASES)


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    """(world, degree, hosts) -> per-rank result dicts, each job run once."""
    @functools.cache
    def get(config) -> list[dict]:
        world, mp, nhosts = config
        return parity.run_ranks(tmp_path_factory.mktemp(f"tp{world}x{mp}"), "tp_parity.py",
                                world, [str(mp)], nhosts, timeout=240)

    return get


def _ids(pair) -> str:
    (world, mp, hosts), case = pair
    return f"world{world}-mp{mp}" + ("-2hosts" if hosts > 1 else "") + f"-{case.key}"


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_per_step_losses_equal_one_process(serial, parallel, config, case):
    world = config[0]
    ranks = parallel(config)
    losses = np.array([r[f"{case.key}|loss"] for r in ranks])      # [rank, step]
    for r in range(1, world):   # every rank logs the same global-batch loss, bitwise
        np.testing.assert_array_equal(losses[r], losses[0])
    np.testing.assert_allclose(losses[0], serial[case.key].losses, **case.tolerance("loss"))


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_shards_after_startup_are_bitwise_slices_of_the_serial_parameters(
        serial, parallel, config, case):
    world, mp, _ = config
    ranks = parallel(config)
    init = serial[case.key].init
    for group in range(world // mp):
        for name, whole in init.items():
            np.testing.assert_array_equal(parity.gathered(ranks, case, "init", name, group, mp),
                                          whole, err_msg=name)


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_final_parameters_gathered_equal_one_process_and_dp_replicas_are_identical(
        serial, parallel, config, case):
    world, mp, _ = config
    ranks = parallel(config)
    parity.check_final(ranks, case, serial[case.key].final, world, mp)
