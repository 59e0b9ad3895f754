"""Worker: train every case of tp_cases (and its META_CASES, in a job of META_CONFIGS)
with tensor_parallel_degree argv[1] and write, per case, the per-step losses (of the global
batch: averaged over the data-parallel ring) and each parameter after startup and after
the last step to rank<N>.npz (keys ``<case>|loss``,
``<case>|init|<param>``, ``<case>|final|<param>``, and ``<case>|axis|<param>``: the axis a
sharded parameter is cut along, -1 if whole)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import numpy as np
from tests.runtime.distributed.tp_cases import (
    CASES,
    GLOBAL_BATCH,
    META_CASES,
    META_CONFIGS,
    SEED,
    STEPS,
    build_programs,
    rows,
)
from tests.runtime.distributed.workers.parity_start import keep_final, start

from ringflow.distributed import fleet, get_ring


def train(case, mp: int, out: dict) -> None:
    main, startup, model = build_programs(
        case, mp, lambda opt, model: fleet.distributed_optimizer(opt, case.strategy(model, mp)))
    scope, exe, params = start(case, main, startup, out)
    for name in params:
        out[f"{case.key}|init|{name}"] = np.array(scope[name])
    dp = fleet.worker_num() // mp
    mine = rows(fleet.worker_index() // mp, dp)
    losses = []
    for step in range(STEPS):
        batch = model.make_batch(SEED, step, GLOBAL_BATCH)
        loss, = exe.run(main, feed={k: v[mine] for k, v in batch.items()},
                        fetch_list=[model.loss], scope=scope)
        if dp > 1:   # the logged loss is the global batch's: the mean over the dp ring
            get_ring(2).all_reduce(loss)
            loss /= dp
        losses.append(float(loss.reshape(-1)[0]))
    out[f"{case.key}|loss"] = np.array(losses)
    keep_final(case, scope, params, out)


def main() -> None:
    mp = int(sys.argv[1])
    fleet.init(is_collective=True)
    out: dict = {}
    meta = (fleet.worker_num(), mp, 1) in META_CONFIGS
    for case in CASES + (META_CASES if meta else []):
        train(case, mp, out)
    np.savez(f"rank{fleet.worker_index()}.npz", **out)


if __name__ == "__main__":
    main()
