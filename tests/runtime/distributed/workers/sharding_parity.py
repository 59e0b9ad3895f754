"""Worker: train every case of sharding_cases (and its META_CASES in a job of META_CONFIGS)
with tensor-parallel degree argv[1] and sharding stage argv[2] (0: plain data parallelism)
and write, per case, the per-step losses of the global batch, each parameter after the last
step and the optimizer state this rank holds (names and bytes), to rank<N>.npz (keys
``<case>|loss``, ``<case>|final|<param>``, ``<case>|axis|<param>``, ``<case>|state_names``,
``<case>|state_bytes``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import numpy as np
from tests.runtime.distributed.sharding_cases import CASES, META_CASES, META_CONFIGS, distributed
from tests.runtime.distributed.tp_cases import GLOBAL_BATCH, SEED, STEPS, build_programs, rows
from tests.runtime.distributed.workers.parity_start import keep_final, start

import ringflow as rf
from ringflow.distributed import fleet, get_ring


def state_arrays(main, scope) -> dict[str, int]:
    """Optimizer state this rank holds, name -> bytes: the persistable arrays in the scope
    that are not parameters (the learning rate and AMP's scale included)."""
    params = {p.name for p in main.all_parameters()}
    return {v.name: np.asarray(scope[v.name]).nbytes
            for v in main.global_block().vars.values()
            if v.persistable and v.name not in params and v.name in scope}


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def shared_layout(exe, scope, params: list[str]) -> bool:
    """Whether every parameter is a view of one buffer (the all-gather's) that the fused
    update steps update where it lies (their parameter storage is that buffer)."""
    roots = {id(_root(np.asarray(scope[n]))) for n in params}
    flats = list(exe.flat_state(scope).values())
    return len(roots) == 1 and all(
        id(_root(f.buffers["Param"])) in roots for f in flats)


def train(case, mp: int, stage: int, out: dict) -> None:
    main, startup, model = build_programs(case, mp, distributed(case, mp, stage))
    scope, exe, params = start(case, main, startup, out)
    dp = fleet.worker_num() // mp
    mine = rows(fleet.worker_index() // mp, dp)
    losses = []
    program = main if case.build_strategy() is None \
        else rf.CompiledProgram(main, case.build_strategy())
    for step in range(STEPS):
        batch = model.make_batch(SEED, step, GLOBAL_BATCH)
        loss, = exe.run(program, feed={k: v[mine] for k, v in batch.items()},
                        fetch_list=[model.loss], scope=scope)
        get_ring(1 if stage else 0).all_reduce(loss)   # the global batch's loss
        losses.append(float(loss.reshape(-1)[0]) / dp)
    out[f"{case.key}|loss"] = np.array(losses)
    out[f"{case.key}|one_buffer"] = np.array(shared_layout(exe, scope, params))
    state = state_arrays(main, scope)
    out[f"{case.key}|state_names"] = np.array(sorted(state), dtype=str)
    out[f"{case.key}|state_bytes"] = np.array([state[n] for n in sorted(state)], dtype=np.int64)
    keep_final(case, scope, params, out)


def main() -> None:
    mp, stage, hosts = (int(a) for a in sys.argv[1:4])
    fleet.init(is_collective=True)
    out: dict = {}
    meta = (fleet.worker_num(), mp, stage, hosts) in META_CONFIGS
    for case in CASES + (META_CASES if meta else []):
        train(case, mp, stage, out)
    np.savez(f"rank{fleet.worker_index()}.npz", **out)


if __name__ == "__main__":
    main()
