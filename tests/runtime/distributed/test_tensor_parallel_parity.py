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

import numpy as np
import pytest

import ringflow as rf
from ringflow.distributed import fleet
from tests.runtime.distributed.tp_cases import (
    CASES,
    CONFIGS,
    GLOBAL_BATCH,
    META_CASES,
    META_CONFIGS,
    SEED,
    STEPS,
    build_programs,
)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ENV = {"RINGFLOW_COMM_TIMEOUT": "60", "RINGFLOW_RENDEZVOUS_TIMEOUT": "60"}


PAIRS = ([(config, case) for config in CONFIGS for case in CASES]
         + [(config, case) for config in META_CONFIGS for case in META_CASES])


def _serial_build(case):
    """One process; a meta case through fleet in a world of one, its feature alone."""
    if not case.meta:
        return build_programs(case, mp_degree=1)
    saved = dict(fleet._fleet.__dict__)
    try:
        fleet.init(is_collective=True)
        return build_programs(case, 1, lambda opt, model: fleet.distributed_optimizer(
            opt, case.strategy(model, None)))
    finally:
        fleet._fleet.__dict__.update(saved)


@pytest.fixture(scope="module")
def serial():
    """case key -> (losses, parameters after startup, parameters after the last step)."""
    results = {}
    for case in CASES + META_CASES:
        main, startup, model = _serial_build(case)
        scope, exe = rf.Scope(), rf.Executor()
        exe.run(startup, scope=scope)
        names = [p.name for p in main.all_parameters()]
        init = {n: np.array(scope[n]) for n in names}
        losses = [float(exe.run(main, feed=model.make_batch(SEED, step, GLOBAL_BATCH),
                                fetch_list=[model.loss], scope=scope)[0].reshape(-1)[0])
                  for step in range(STEPS)]
        results[case.key] = (np.array(losses), init, {n: np.array(scope[n]) for n in names})
    return results


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    """(world, degree, hosts) -> per-rank result dicts, each job run once."""
    from tests.runtime.distributed.spawn import Spawner

    cache: dict = {}

    def get(config) -> list[dict]:
        if config not in cache:
            world, mp, nhosts = config
            tmp = tmp_path_factory.mktemp(f"tp{world}x{mp}")
            hosts = [f"127.0.0.{1 + r * nhosts // world}" for r in range(world)]
            spawner = Spawner(tmp)
            try:
                job = spawner("tp_parity.py", world, args=[str(mp)], env=ENV, hosts=hosts)
                assert job.wait(timeout=240) == [0] * world, job.output()
                assert job.shm_segments() == []
            finally:
                spawner.close()
            cache[config] = [dict(np.load(tmp / f"rank{r}.npz")) for r in range(world)]
        return cache[config]

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
    np.testing.assert_allclose(losses[0], serial[case.key][0], **case.tolerance("loss"))


def _gathered(ranks: list[dict], case, stage: str, name: str, group: int, mp: int):
    axis = int(ranks[0][f"{case.key}|axis|{name}"])
    pieces = [ranks[r][f"{case.key}|{stage}|{name}"] for r in range(group * mp, (group + 1) * mp)]
    if axis < 0:
        for piece in pieces[1:]:      # a replicated parameter is the same on every mp rank
            np.testing.assert_array_equal(piece, pieces[0], err_msg=name)
        return pieces[0]
    return np.concatenate(pieces, axis=axis)


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_shards_after_startup_are_bitwise_slices_of_the_serial_parameters(
        serial, parallel, config, case):
    world, mp, _ = config
    ranks = parallel(config)
    init = serial[case.key][1]
    for group in range(world // mp):
        for name, whole in init.items():
            np.testing.assert_array_equal(_gathered(ranks, case, "init", name, group, mp),
                                          whole, err_msg=name)


@pytest.mark.parametrize("config, case", PAIRS, ids=[_ids(p) for p in PAIRS])
def test_final_parameters_gathered_equal_one_process_and_dp_replicas_are_identical(
        serial, parallel, config, case):
    world, mp, _ = config
    ranks = parallel(config)
    final = serial[case.key][2]
    for name, whole in final.items():
        replicas = [_gathered(ranks, case, "final", name, g, mp) for g in range(world // mp)]
        for replica in replicas[1:]:
            np.testing.assert_array_equal(replica, replicas[0], err_msg=name)
        np.testing.assert_allclose(replicas[0], whole, err_msg=name, **case.tolerance("params"))
