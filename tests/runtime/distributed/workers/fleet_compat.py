"""Worker: train the cases of fleet_compat_cases with tensor-parallel degree argv[1] (set
through hybrid_configs), the sharding ones (argv[2] "sharding") or the others, and write,
per case, this rank's loss of each micro-step and each parameter after the last step to
rank<N>.npz (keys ``<case>|loss`` (steps x micro-steps), ``<case>|final|<param>``,
``<case>|axis|<param>``) and the meta-optimizers applied (``<case>|applied``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import numpy as np
from tests.runtime.distributed.fleet_compat_cases import cases, micro_rows
from tests.runtime.distributed.tp_cases import GLOBAL_BATCH, SEED, STEPS, build_programs
from tests.runtime.distributed.workers.parity_start import keep_final, start

from ringflow.distributed import fleet


def train(case, mp: int, out: dict) -> None:
    world = fleet.worker_num()
    main, startup, model = build_programs(case, mp, lambda opt, model: fleet.distributed_optimizer(
        opt, case.paddle_strategy(world, mp)))
    out[f"{case.key}|applied"] = np.array(fleet._get_applied_meta_list()
                                          + fleet._get_applied_graph_list(), dtype=str)
    scope, exe, params = start(case, main, startup, out)
    dp = world // mp
    dp_rank = fleet.worker_index() // mp
    losses = []
    for step in range(STEPS):
        batch = model.make_batch(SEED, step, GLOBAL_BATCH)
        for micro in range(case.micro_steps):
            mine = micro_rows(micro, dp_rank, dp, case.micro_steps)
            loss, = exe.run(main, feed={k: v[mine] for k, v in batch.items()},
                            fetch_list=[model.loss], scope=scope)
            losses.append(float(loss.reshape(-1)[0]))
    out[f"{case.key}|loss"] = np.array(losses).reshape(STEPS, case.micro_steps)
    keep_final(case, scope, params, out)


def main() -> None:
    mp = int(sys.argv[1])
    fleet.init(is_collective=True)
    out: dict = {}
    # one job trains the sharding cases, another the rest: sharding lays out rings 0, 1, 3,
    # the others 0, 1, 2 (or 0 alone), so the two kinds do not share a process
    sharding = sys.argv[2] == "sharding"
    for case in cases(fleet.worker_num(), mp):
        if (case.form == "sharding") == sharding:
            train(case, mp, out)
    np.savez(f"rank{fleet.worker_index()}.npz", **out)


if __name__ == "__main__":
    main()
