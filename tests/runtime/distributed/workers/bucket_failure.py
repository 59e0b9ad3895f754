"""Worker: data-parallel training with tiny buckets on a communication thread; rank 1 dies
(os._exit) in the middle of its second step's backward pass, while rank 0 has buckets in
flight. Rank 0 must fail with a CommError naming the peer and the ring, not hang.
argv[1]: the sharding stage (0: plain data parallelism; else the buckets reduce-scatter)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

from tests.runtime.distributed.workers.bucket_cases import BATCH, SEED, build

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.errors import CommError


def main() -> None:
    fleet.init(is_collective=True)
    rank = fleet.worker_index()
    stage = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    program, startup, model = build(1, "float32", stage)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    compiled = rf.CompiledProgram(program, rf.BuildStrategy(fuse_grad_size_in_MB=0.004,
                                                            overlap_comm=True))
    plan = exe.prepared(compiled, [model.loss])
    if rank == 1:   # die right after launching the second bucket of step 2
        launches = [s for s in plan.steps
                    if s.op.type in ("bucket_allreduce", "bucket_reduce_scatter")]
        target, calls = launches[1], {"n": 0}
        kernel = target.kernel

        def dying(ctx):
            kernel(ctx)
            calls["n"] += 1
            if calls["n"] == 2:
                os._exit(3)

        target.kernel = dying
    try:
        for step in range(5):
            batch = model.make_batch(SEED, step, BATCH)
            rows = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
            exe.run(compiled, feed={k: v[rows] for k, v in batch.items()},
                    fetch_list=[model.loss], scope=scope)
    except CommError as exc:
        print(f"CommError: {exc}", flush=True)
        sys.exit(17)
    print("no error", flush=True)


if __name__ == "__main__":
    main()
