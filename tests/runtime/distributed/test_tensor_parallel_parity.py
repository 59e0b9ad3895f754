"""Parallel == serial: the MLP and the transformer trained with SGD, Adam (clipped), Lamb
and LARS by tensor-parallel + data-parallel jobs give the per-step losses and, gathered, the
final parameters of one process (rtol 1e-10 in float64, 1e-5 in float32), and every shard
after startup is bitwise the slice of the serial parameter (DESIGN.md section 8).

Each (world, degree) starts its processes once; they train every case (tp_cases.CASES) and
write their results; the serial reference is trained here, once per case.
"""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from tests.runtime.distributed.tp_cases import (
    CASES,
    CONFIGS,
    GLOBAL_BATCH,
    SEED,
    STEPS,
    TOLERANCE,
    build_programs,
)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ENV = {"RINGFLOW_COMM_TIMEOUT": "60", "RINGFLOW_RENDEZVOUS_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def serial():
    """case key -> (losses, parameters after startup, parameters after the last step)."""
    results = {}
    for case in CASES:
        main, startup, model = build_programs(case, mp_degree=1)
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


def _ids(config) -> str:
    world, mp, hosts = config
    return f"world{world}-mp{mp}" + ("-2hosts" if hosts > 1 else "")


@pytest.mark.parametrize("config", CONFIGS, ids=_ids)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_per_step_losses_equal_one_process(serial, parallel, config, case):
    world = config[0]
    ranks = parallel(config)
    losses = np.array([r[f"{case.key}|loss"] for r in ranks])      # [rank, step]
    for r in range(1, world):   # every rank logs the same global-batch loss, bitwise
        np.testing.assert_array_equal(losses[r], losses[0])
    np.testing.assert_allclose(losses[0], serial[case.key][0], **TOLERANCE[case.dtype])


def _gathered(ranks: list[dict], case, stage: str, name: str, group: int, mp: int):
    axis = int(ranks[0][f"{case.key}|axis|{name}"])
    pieces = [ranks[r][f"{case.key}|{stage}|{name}"] for r in range(group * mp, (group + 1) * mp)]
    if axis < 0:
        for piece in pieces[1:]:      # a replicated parameter is the same on every mp rank
            np.testing.assert_array_equal(piece, pieces[0], err_msg=name)
        return pieces[0]
    return np.concatenate(pieces, axis=axis)


@pytest.mark.parametrize("config", CONFIGS, ids=_ids)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_shards_after_startup_are_bitwise_slices_of_the_serial_parameters(
        serial, parallel, config, case):
    world, mp, _ = config
    ranks = parallel(config)
    init = serial[case.key][1]
    for group in range(world // mp):
        for name, whole in init.items():
            np.testing.assert_array_equal(_gathered(ranks, case, "init", name, group, mp),
                                          whole, err_msg=name)


@pytest.mark.parametrize("config", CONFIGS, ids=_ids)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_final_parameters_gathered_equal_one_process_and_dp_replicas_are_identical(
        serial, parallel, config, case):
    world, mp, _ = config
    ranks = parallel(config)
    final = serial[case.key][2]
    for name, whole in final.items():
        replicas = [_gathered(ranks, case, "final", name, g, mp) for g in range(world // mp)]
        for replica in replicas[1:]:
            np.testing.assert_array_equal(replica, replicas[0], err_msg=name)
        np.testing.assert_allclose(replicas[0], whole, err_msg=name, **TOLERANCE[case.dtype])
