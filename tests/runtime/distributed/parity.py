"""What the parity tests (parallel == serial) share: a worker script run once on N ranks over
one or two "hosts" (127.0.0.1, 127.0.0.2) with its per-rank results gathered, the serial
reference trained in this process, and a parameter put back together from its shards."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

import ringflow as rf
from ringflow.distributed import fleet
from tests.runtime.distributed.tp_cases import GLOBAL_BATCH, SEED, STEPS, build_programs

ENV = {"RINGFLOW_COMM_TIMEOUT": "60", "RINGFLOW_RENDEZVOUS_TIMEOUT": "60"}


def run_ranks(tmp: Path, worker: str, world: int, args: list[str], nhosts: int,
              timeout: float, check_shm: bool = True) -> list[dict]:
    """Run workers/`worker` on `world` ranks, host-major over `nhosts` hosts, in `tmp`; every
    rank exits 0 and (check_shm) no shm segment is left; each rank's rank<N>.npz as a dict."""
    from tests.runtime.distributed.spawn import Spawner

    hosts = [f"127.0.0.{1 + r * nhosts // world}" for r in range(world)]
    spawner = Spawner(tmp)
    try:
        job = spawner(worker, world, args=args, env=ENV, hosts=hosts)
        assert job.wait(timeout=timeout) == [0] * world, job.output()
        if check_shm:
            assert job.shm_segments() == []
    finally:
        spawner.close()
    return [dict(np.load(tmp / f"rank{r}.npz")) for r in range(world)]


def serial_build(case):
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


class Serial(NamedTuple):
    """One process's training: the per-step losses, every parameter after startup and after
    the last step."""
    losses: np.ndarray
    init: dict[str, np.ndarray]
    final: dict[str, np.ndarray]


def train_serial(main, startup, model) -> Serial:
    """One process trains STEPS steps of the global batch."""
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(startup, scope=scope)
    names = [p.name for p in main.all_parameters()]
    init = {n: np.array(scope[n]) for n in names}
    losses = [float(exe.run(main, feed=model.make_batch(SEED, step, GLOBAL_BATCH),
                            fetch_list=[model.loss], scope=scope)[0].reshape(-1)[0])
              for step in range(STEPS)]
    return Serial(np.array(losses), init, {n: np.array(scope[n]) for n in names})


def train_each(cases, build=serial_build) -> dict[str, Serial]:
    """case key -> one process's training of that case (its programs made by `build`)."""
    return {case.key: train_serial(*build(case)) for case in cases}


def gathered(ranks: list[dict], case, stage: str, name: str, group: int, mp: int):
    """Parameter `name` at `stage` (init, final) of data-parallel group `group`: its mp
    shards concatenated along the axis it was cut on, or the one replicated copy."""
    axis = int(ranks[0][f"{case.key}|axis|{name}"])
    pieces = [ranks[r][f"{case.key}|{stage}|{name}"] for r in range(group * mp, (group + 1) * mp)]
    if axis < 0:
        for piece in pieces[1:]:      # a replicated parameter is the same on every mp rank
            np.testing.assert_array_equal(piece, pieces[0], err_msg=name)
        return pieces[0]
    return np.concatenate(pieces, axis=axis)


def pairs(configs, cases, meta_configs, meta_cases) -> list[tuple]:
    """(config, case): every case in every configuration, the meta cases in theirs."""
    return ([(config, case) for config in configs for case in cases]
            + [(config, case) for config in meta_configs for case in meta_cases])


def check_final(ranks: list[dict], case, final: dict, world: int, mp: int) -> None:
    """Every data-parallel replica's parameters, gathered from its mp shards, are the same
    bitwise, and equal one process's `final` within the case's tolerance."""
    for name, whole in final.items():
        replicas = [gathered(ranks, case, "final", name, g, mp) for g in range(world // mp)]
        for replica in replicas[1:]:
            np.testing.assert_array_equal(replica, replicas[0], err_msg=name)
        np.testing.assert_allclose(replicas[0], whole, err_msg=name, **case.tolerance("params"))
