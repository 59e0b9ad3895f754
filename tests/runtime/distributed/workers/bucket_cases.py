"""Worker: one MLP job trained under several BuildStrategies (per-gradient all-reduces,
one bucket, many tiny buckets with and without a communication thread, no GEMM fusion, no
update fusion), each
from the same initial parameters, writing per case the per-step losses and the final
parameters to rank<N>.npz (``<case>|loss``, ``<case>|<param>``), and ``<case>|buckets``,
``<case>|threads`` (how many communication threads the executor started) and
``<case>|spans`` (per fused update step, how many runs of gradients lying end to end it
swept)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import numpy as np

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.models import mlp

CASES = {
    "per_gradient": dict(fuse_all_reduce_ops=False),
    "one_bucket": dict(),
    "tiny_sync": dict(fuse_grad_size_in_MB=0.004, overlap_comm=False),
    "tiny_overlap": dict(fuse_grad_size_in_MB=0.004, overlap_comm=True),
    "tiny_auto": dict(fuse_grad_size_in_MB=0.004),
    "unfused": dict(fuse_gemm_epilogue=False),
    "unfused_update": dict(fuse_all_optimizer_ops=False),
}
STEPS, BATCH, SEED = 4, 16, 5


def build(mp: int, dtype: str, sharding_stage: int = 0):
    strategy = fleet.DistributedStrategy()
    strategy.tensor_parallel = True
    strategy.tensor_parallel_configs = {"tensor_parallel_degree": mp}
    if sharding_stage:
        strategy.sharding = True
        strategy.sharding_configs = {"stage": sharding_stage}
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = SEED
    with rf.program_guard(main, startup):
        model = mlp(input_size=12, hidden_size=32, num_classes=6, num_layers=3,
                    mp_degree=mp, dtype=dtype)
        opt = rf.optimizer.Adam(0.01, grad_clip=rf.ClipGradByGlobalNorm(1.0))
        fleet.distributed_optimizer(opt, strategy).minimize(model.loss)
    return main, startup, model


def main() -> None:
    mp, dtype = int(sys.argv[1]), sys.argv[2]
    fleet.init(is_collective=True)
    rank, world = fleet.worker_index(), fleet.worker_num()
    dp, dp_rank = world // mp, fleet.worker_index() // mp
    out = {}
    program, startup, model = build(mp, dtype)
    for case, options in CASES.items():
        scope, exe = rf.Scope(), rf.Executor()
        exe.run(startup, scope=scope)
        compiled = rf.CompiledProgram(program, rf.BuildStrategy(**options))
        rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
        losses = []
        for step in range(STEPS):
            batch = model.make_batch(SEED, step, BATCH)
            loss, = exe.run(compiled, feed={k: v[rows] for k, v in batch.items()},
                            fetch_list=[model.loss], scope=scope)
            losses.append(loss.reshape(-1)[0])
        out[f"{case}|loss"] = np.array(losses)
        out[f"{case}|buckets"] = np.array(len(exe.prepared(compiled, [model.loss]).buckets))
        out[f"{case}|threads"] = np.array(len(exe._streams))
        # per fused update step, the spans of gradients it swept at once
        out[f"{case}|spans"] = np.array(
            [len(f._spans) for f in exe.flat_state(scope).values()], dtype=np.int64)
        for p in program.all_parameters():
            out[f"{case}|{p.name}"] = np.array(scope[p.name])
        exe.close()
    np.savez(f"rank{rank}.npz", **out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
