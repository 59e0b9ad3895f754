"""Memory of a sharded step (issue 19): per rank, the bytes of the arrays the executor holds
after two training steps of train_parallel.py's models (float32, Adam), by what they hold:
optimizer state (persistable arrays that are not parameters), parameter gradients (the
arrays they are views of: buckets, stage 2's staging buffers and kept shards), parameters,
and everything else (activations and their gradients, kernel buffers). Counted as the recompute
table counts (tests/runtime/test_recompute.py's ``live_bytes``): every distinct base array
the scope and the executor's own buffers hold, once.

    .venv/bin/python benchmarks/shard_memory.py [--shapes A,B,T] [--worlds 1,2,4]

Bytes, not time: it needs no quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train_parallel as tp  # noqa: E402

KINDS = ("state", "grads", "params", "other")


def _base(arr):
    while hasattr(arr, "base") and arr.base is not None and hasattr(arr.base, "nbytes"):
        arr = arr.base
    return arr


def held_bytes(main, exe, scope) -> dict[str, int]:
    """Bytes of every distinct base array by the kind of the first variable that holds it
    (state, then gradients, then parameters, then the rest)."""
    import numpy as np

    params = {p.name for p in main.all_parameters()}
    block = main.global_block()

    def kind(name: str) -> str:
        var = block.vars.get(name)
        if var is not None and var.persistable and name not in params:
            return "state"
        if name.endswith("@GRAD") and name[:-len("@GRAD")] in params:
            return "grads"
        return "params" if name in params else "other"

    named = sorted(scope._vars.items(), key=lambda kv: KINDS.index(kind(kv[0])))
    seen, out = set(), dict.fromkeys(KINDS, 0)
    for name, arr in [*named, *(("", a) for a in exe._owned.values())]:
        if not isinstance(arr, np.ndarray):
            continue
        base = _base(arr)
        if id(base) not in seen:
            seen.add(id(base))
            out[kind(name) if name else "other"] += base.nbytes
    return out


def worker(shape: str) -> None:
    import ringflow as rf
    from ringflow.distributed import fleet

    fleet.init(is_collective=True)
    world, rank = fleet.worker_num(), fleet.worker_index()
    main, startup, loss, make = tp.ringflow_model(shape, 1)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    batch = tp.SHAPES[shape][1]
    full = make(0, 0, batch)
    feed = {k: v[rank * batch // world:(rank + 1) * batch // world] for k, v in full.items()}
    for _ in range(2):
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    print("MEM " + json.dumps({"rank": rank, **held_bytes(main, exe, scope)}), flush=True)


def run(shape: str, world: int, stage: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    env.update(BENCH_MP="1", BENCH_SHARDING=str(stage))
    out = subprocess.run([sys.executable, "-m", "ringflow.launch", "--nproc-per-host",
                          str(world), "--log-dir", "/tmp/ringflow-mem-logs", __file__,
                          "--worker", shape], env=env, capture_output=True, text=True,
                         timeout=1800, check=True).stdout
    return sorted((json.loads(line.split("MEM ", 1)[1]) for line in out.splitlines()
                   if "MEM " in line), key=lambda r: r["rank"])


def table(results: dict) -> str:
    lines = ["| shape | ranks | sharding | optimizer state MB per rank (max; vs dp) | "
             "gradients MB (max) | parameters MB | everything MB (max) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    mb = 1 << 20
    for (shape, world, stage), ranks in results.items():
        plain = results.get((shape, world, 0)) or results.get((shape, 1, 0))
        state = max(r["state"] for r in ranks)
        ratio = state / max(r["state"] for r in plain) if plain else 0
        lines.append(f"| {shape} | {world} | {stage or 'off'} | {state / mb:.1f} "
                     f"({ratio:.2f}x) | {max(r['grads'] for r in ranks) / mb:.1f} | "
                     f"{ranks[0]['params'] / mb:.1f} | "
                     f"{max(sum(r[k] for k in KINDS) for r in ranks) / mb:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default="A,B,T")
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--out", default=str(HERE / "shard_memory.jsonl"))
    args, _ = ap.parse_known_args()
    if args.worker:
        return worker(args.worker)
    results = {}
    for shape in args.shapes.split(","):
        for world in map(int, args.worlds.split(",")):
            for stage in ((0,) if world == 1 else (0, 1, 2)):
                results[(shape, world, stage)] = run(shape, world, stage)
                print(f"{shape} world {world} stage {stage}: {results[(shape, world, stage)]}",
                      flush=True)
    Path(args.out).write_text("".join(json.dumps({"shape": s, "world": w, "stage": st,
                                                  "ranks": r}) + "\n"
                                      for (s, w, st), r in results.items()))
    print(table(results))
    return None


if __name__ == "__main__":
    main()
