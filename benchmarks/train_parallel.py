"""Parallel-training benchmark (issue 10): steps per second of one training step of the MLP
of train_step.py (A: 1024 -> 4 x 1024 -> 10, batch 256; B: 1024 -> 4 x 4096 -> 10, batch
64) and of a transformer from ringflow.models (T), float32, Adam, as

- one process with 2 BLAS threads: ringflow, and the hand-written numpy floor (MLP only);
- 2 ranks x 1 thread: ringflow dp=2 and mp=2, over shared memory and over TCP, and PyTorch
  DDP (gloo) dp=2 on the same MLP (the anchor; torch only in benchmarks/.venv-torch);
- 4 ranks on the 2 cores (oversubscribed): ringflow dp=4 and mp=2 x dp=2;
- 2 ranks sharded (issue 19): ringflow dp=2 with fleet's sharding stage 1 and 2 (the
  optimizer state, and the gradients, split over the ranks) beside PyTorch's
  ``ZeroRedundancyOptimizer`` (its ZeRO stage 1) with DDP over gloo.

The global batch is the same in every layout (data-parallel rank r takes its rows). Every
run is its own job; rounds run every row once in a shuffled order after a lull; a run whose
other load (CPU used by other processes) was >= 15 % is not quiet. For data-parallel rows the
table also gives the gradient buckets per step and the communication time hidden behind the
backward pass (communication thread busy time minus the time the step waited for it).

    python benchmarks/train_parallel.py [--rounds 3] [--shapes A,B,T] [--rows ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train_step as ts  # noqa: E402  (the floor, the torch venv, the load probes)

SHAPES = {"A": (1024, 256), "B": (4096, 64), "T": (256, 32)}   # hidden, global batch
STEPS = {"A": (3, 12), "B": (2, 6), "T": (3, 12)}               # warm-up, timed
TRANSFORMER = dict(vocab_size=2048, seq_len=64, num_heads=8, num_layers=4)
# row -> (kind, ranks, mp degree, transport[, sharding stage])
ROWS = {
    "numpy-1p": ("numpy", 1, 1, None),
    "ringflow-1p": ("ringflow", 1, 1, None),
    "ringflow-dp2-shm": ("ringflow", 2, 1, "auto"),
    "ringflow-dp2-tcp": ("ringflow", 2, 1, "tcp"),
    "ringflow-mp2-shm": ("ringflow", 2, 2, "auto"),
    "ringflow-mp2-tcp": ("ringflow", 2, 2, "tcp"),
    "torch-ddp-dp2": ("torch-ddp", 2, 1, None),
    "ringflow-dp4-shm": ("ringflow", 4, 1, "auto"),
    "ringflow-mp2dp2-shm": ("ringflow", 4, 2, "auto"),
    "ringflow-dp2-zero1-shm": ("ringflow", 2, 1, "auto", 1),
    "ringflow-dp2-zero2-shm": ("ringflow", 2, 1, "auto", 2),
    "ringflow-dp2-zero1-tcp": ("ringflow", 2, 1, "tcp", 1),
    "torch-zero-dp2": ("torch-zero", 2, 1, None),
}
COMM_STEPS = ("bucket_allreduce", "bucket_reduce_scatter")
UPDATE_OPS = ("adam", "adamw", "lamb", "lars_momentum", "momentum", "sgd")
FOUR_RANK_SHAPES = ("A", "T")   # B with 4 full replicas on 2 cores takes minutes a run
QUIET = ts.QUIET


# --------------------------------------------------------------------------------- workers
def ringflow_model(shape: str, mp: int):
    """(main, startup, loss, batch function) for the MLP (Megatron-style: column then row
    parallel, so every degree computes the serial model) or the transformer."""
    import ringflow as rf
    from ringflow.distributed import fleet

    hidden = SHAPES[shape][0]
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 0
    with rf.program_guard(main, startup):
        if shape == "T":
            model = rf.models.transformer(hidden_size=hidden, mp_degree=mp, **TRANSFORMER)
            loss, make = model.loss, model.make_batch
        else:
            loss, make = _mlp(rf, hidden, mp)
        opt = rf.optimizer.Adam(ts.LR, beta1=ts.BETAS[0], beta2=ts.BETAS[1], epsilon=ts.EPS)
        if fleet.worker_num() > 1:
            strategy = fleet.DistributedStrategy()
            strategy.tensor_parallel = True
            strategy.tensor_parallel_configs = {"tensor_parallel_degree": mp}
            stage = int(os.environ.get("BENCH_SHARDING", "0"))
            if stage:
                strategy.sharding = True
                strategy.sharding_configs = {"stage": stage}
            opt = fleet.distributed_optimizer(opt, strategy)
        opt.minimize(loss)
    return main, startup, loss, make


def _mlp(rf, hidden: int, mp: int):
    import numpy as np

    split = rf.distributed.split
    x = rf.data("x", shape=[-1, ts.DIN], dtype="float32")
    y = rf.data("y", shape=[-1], dtype="int64")
    h, width = x, ts.DIN
    for i in range(ts.NLAYERS):
        column = i % 2 == 0
        h = split(h, (width, hidden), "linear", axis=1 if column else 0, num_partitions=mp,
                  gather_out=False, weight_attr=rf.ParamAttr(f"fc{i}.w"),
                  bias_attr=rf.ParamAttr(f"fc{i}.b"))
        h, width = rf.nn.relu(h), hidden
    logits = rf.nn.fc(h, ts.NCLS, weight_attr=rf.ParamAttr("out.w"),
                      bias_attr=rf.ParamAttr("out.b"))
    loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))

    def make(seed: int, step: int, batch: int):
        xs, ys = ts.make_batch(np, batch)
        return {"x": xs, "y": ys}

    return loss, make


def run_ringflow(shape: str) -> dict | None:
    """One rank of a ringflow row; rank 0 returns the record."""
    import numpy as np

    import ringflow as rf
    from ringflow.distributed import fleet

    fleet.init(is_collective=True)
    world, rank = fleet.worker_num(), fleet.worker_index()
    mp = int(os.environ.get("BENCH_MP", "1"))
    main, startup, loss, make = ringflow_model(shape, mp)
    exe, scope = rf.Executor(profile=True), rf.Scope()
    exe.run(startup, scope=scope)
    dp, dp_rank = world // mp, rank // mp
    batch = int(os.environ.get("BENCH_BATCH", SHAPES[shape][1]))   # the global batch
    full = make(0, 0, batch)
    feed = {k: v[dp_rank * batch // dp:(dp_rank + 1) * batch // dp] for k, v in full.items()}
    warmup, steps = STEPS[shape]
    times, comm, waited, update = [], [], [], []
    lockstep = _lockstep()
    for k in range(warmup + steps):
        if lockstep is not None:   # every copy begins the step together, as a job's ranks do
            lockstep.sendall(b"r")
            lockstep.recv(1)
        busy0 = sum(s.busy_s for s in exe._streams.values())
        exe.reset_profile()
        t0 = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
            stats = exe.profile_stats()
            comm.append(sum(s.busy_s for s in exe._streams.values()) - busy0
                        + sum(stats.get(t, (0, 0.0))[1] for t in COMM_STEPS)
                        * (not exe._streams) + stats.get("param_allgather", (0, 0.0))[1])
            waited.append(sum(stats.get(t, (0, 0.0))[1]
                              for t in ("bucket_wait", "c_sync_comm_stream")))
            update.append(sum(stats.get(t, (0, 0.0))[1] for t in UPDATE_OPS))
    if rank != 0:
        return None
    plan = exe.prepared(main, [loss])
    return {"step_ms": [1e3 * t for t in times], "buckets": len(plan.buckets),
            "params": sum(int(np.prod(p.shape)) for p in main.all_parameters()),
            "state_mb": _state_bytes(main, scope) / 2 ** 20,
            "comm_ms": 1e3 * statistics.median(comm), "waited_ms": 1e3 * statistics.median(waited),
            "overlap": bool(exe._streams), "update_ms": 1e3 * statistics.median(update),
            "update_threads": os.environ.get("RINGFLOW_NUM_THREADS"),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "blas_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT")}


def _lockstep() -> socket.socket | None:
    """With BENCH_LOCKSTEP=<port> (scaling.py's calibration of several copies): a connection
    to the barrier that starts every copy's steps together."""
    port = os.environ.get("BENCH_LOCKSTEP")
    return socket.create_connection(("127.0.0.1", int(port))) if port else None


def _state_bytes(main, scope) -> int:
    """Optimizer state this rank holds: its persistable arrays that are not parameters."""
    import numpy as np

    params = {p.name for p in main.all_parameters()}
    return sum(np.asarray(scope[v.name]).nbytes for v in main.global_block().vars.values()
               if v.persistable and v.name not in params and v.name in scope)


def run_numpy(shape: str) -> dict:
    import numpy as np

    hidden, batch = SHAPES[shape]
    step = ts.NumpyStep(np, hidden, batch).step
    x, y = ts.make_batch(np, batch)
    warmup, steps = STEPS[shape]
    times = []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        step(x, y)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return {"step_ms": [1e3 * t for t in times]}


def run_torch_ddp(shape: str) -> dict | None:
    """One rank of PyTorch DDP (gloo) on the same MLP; rank 0 returns the record."""
    import itertools

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = int(os.environ["BENCH_RANK"]), int(os.environ["BENCH_WORLD"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=os.environ["BENCH_INIT"], rank=rank,
                            world_size=world)
    hidden, batch = SHAPES[shape]
    dims = [ts.DIN] + [hidden] * ts.NLAYERS + [ts.NCLS]
    layers = []
    for a, b in itertools.pairwise(dims):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers[:-1]))
    if os.environ.get("BENCH_ZERO") == "1":     # ZeRO stage 1: the Adam state sharded
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=ts.LR, betas=ts.BETAS, eps=ts.EPS)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=ts.LR, betas=ts.BETAS, eps=ts.EPS)
    xn, yn = ts.make_batch(np, batch)
    rows = slice(rank * batch // world, (rank + 1) * batch // world)
    x, y = torch.from_numpy(xn[rows]), torch.from_numpy(yn[rows])
    warmup, steps = STEPS[shape]
    times = []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return {"step_ms": [1e3 * t for t in times]} if rank == 0 else None


def worker(kind: str, shape: str) -> None:
    rec = {"numpy": run_numpy, "ringflow": run_ringflow, "torch-ddp": run_torch_ddp,
           "torch-zero": run_torch_ddp}[kind](shape)
    if rec is not None:
        print("BENCH " + json.dumps(rec), flush=True)


# ---------------------------------------------------------------------------------- driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commands(row: str, shape: str, torch_py: str | None) -> list[tuple[list[str], dict]]:
    kind, ranks, mp, transport = ROWS[row][:4]
    me = [str(Path(__file__).resolve()), "--worker", kind, "--shape", shape]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    if kind == "ringflow":
        # every ringflow row runs as users run it, under the launcher (one process too: its
        # threads, BLAS and update, are the launcher's defaults)
        env.update(BENCH_MP=str(mp), BENCH_SHARDING=str((*ROWS[row], 0)[4]))
        if transport:
            env.update(RINGFLOW_TRANSPORT=transport)
        return [([sys.executable, "-m", "ringflow.launch", "--nproc-per-host", str(ranks),
                  "--log-dir", "/tmp/ringflow-bench-logs", *me], env)]
    threads = "2" if ranks == 1 else "1"
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = threads
    if kind in ("torch-ddp", "torch-zero"):
        init = f"tcp://127.0.0.1:{_free_port()}"
        zero = "1" if kind == "torch-zero" else "0"
        return [([torch_py, *me], {**env, "BENCH_RANK": str(r), "BENCH_WORLD": str(ranks),
                                   "BENCH_INIT": init, "BENCH_ZERO": zero})
                for r in range(ranks)]
    return [([sys.executable, *me], env)]


def run_row(row: str, shape: str, torch_py: str | None, timeout: float = 1200) -> dict:
    busy0, t0 = ts.busy_seconds(), time.perf_counter()
    cpu0 = os.times().children_user + os.times().children_system
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for cmd, env in _commands(row, shape, torch_py)]
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{row} {shape}: no result within {timeout} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{row} {shape} exited {proc.returncode}:\n{out[-2000:]}\n"
                               f"{err[-2000:]}")
        outs.append(out)
    wall, busy = time.perf_counter() - t0, ts.busy_seconds() - busy0
    cpu = os.times().children_user + os.times().children_system - cpu0
    line = next(ln for o in outs for ln in o.splitlines() if "BENCH " in ln)
    rec = json.loads(line.split("BENCH ", 1)[1])
    rec.update(row=row, shape=shape, wall_s=wall,
               foreign=max(0.0, busy - cpu) / (wall * os.cpu_count()))
    return rec


def cases(rows: list[str], shapes: list[str]) -> list[tuple[str, str]]:
    out = []
    for row in rows:
        kind, ranks = ROWS[row][:2]
        for shape in shapes:
            if (kind in ("numpy", "torch-ddp", "torch-zero") and shape == "T") or (
                    ranks == 4 and shape not in FOUR_RANK_SHAPES):
                continue
            out.append((row, shape))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="A", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="A,B,T")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--torch-python", default=None)
    ap.add_argument("--wait-quiet", type=float, default=20.0)
    ap.add_argument("--out", default=str(HERE / "results" / "train_parallel.md"))
    ap.add_argument("--report", default=None, help="only summarize this .jsonl")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.shape)
    out = Path(args.out)
    if args.report:
        records = [json.loads(x) for x in Path(args.report).read_text().splitlines() if x]
        print(render(records))
        return None
    rows = args.rows.split(",")
    torch_py = ts.ensure_torch_python(args.torch_python) \
        if {"torch-ddp-dp2", "torch-zero-dp2"} & set(rows) else None
    todo, records = cases(rows, args.shapes.split(",")), []
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        order = todo[:]
        random.Random(r).shuffle(order)
        for row, shape in order:
            if args.wait_quiet > 0:
                ts.wait_quiet(args.wait_quiet)
            rec = run_row(row, shape, torch_py)
            rec["round"] = r
            records.append(rec)
            print(f"round {r} {row:20s} {shape}: {statistics.median(rec['step_ms']):8.1f} ms "
                  f" other load {rec['foreign']:.2f}", flush=True)
            out.with_suffix(".jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))
    text = render(records)
    out.write_text(text)
    print(text)
    return None


def _median_ms(recs: list[dict]) -> tuple[float, int, int]:
    quiet = [r for r in recs if r["foreign"] < QUIET]
    use = quiet or recs
    return statistics.median(statistics.median(r["step_ms"]) for r in use), len(quiet), len(recs)


def render(records: list[dict]) -> str:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["shape"], r["row"]), []).append(r)
    lines = ["| shape | row | ms/step | steps/s | vs ringflow-1p | vs torch DDP | vs torch ZeRO "
             "| update ms | state MB | buckets | comm ms | hidden ms | quiet runs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in SHAPES:
        refs = [groups.get((shape, r)) for r in ("ringflow-1p", "torch-ddp-dp2",
                                                   "torch-zero-dp2")]
        for row in ROWS:
            recs = groups.get((shape, row))
            if not recs:
                continue
            ms, nq, n = _median_ms(recs)
            ratios = [f"{_median_ms(ref)[0] / ms:.2f}x" if ref else "" for ref in refs]
            lines.append(f"| {shape} | {row} | {ms:.1f}{'' if nq else '*'} | {1e3 / ms:.2f} | "
                         + " | ".join(ratios) + " | " + " | ".join(_extras(row, recs))
                         + f" | {nq}/{n} |")
    return "\n".join(lines) + "\n"


def _extras(row: str, recs: list[dict]) -> list[str]:
    """update ms, state MB, buckets, comm ms, hidden ms of a ringflow row (else blanks)."""
    use = [r for r in recs if r["foreign"] < QUIET] or recs
    comm = hidden = buckets = update = state = ""
    if "update_ms" in use[0]:
        update = f"{statistics.median(r['update_ms'] for r in use):.1f}"
    if "state_mb" in use[0]:
        state = f"{use[0]['state_mb']:.1f}"
    if "buckets" in use[0] and ROWS[row][1] // ROWS[row][2] > 1:
        buckets = str(use[0]["buckets"])
        c = statistics.median(r["comm_ms"] for r in use)
        w = statistics.median(r["waited_ms"] for r in use)
        comm = f"{c:.1f}"
        hidden = f"{max(c - w, 0.0):.1f}" if use[0].get("overlap") else "0 (sync)"
    return [update, state, buckets, comm, hidden]


if __name__ == "__main__":
    main()
