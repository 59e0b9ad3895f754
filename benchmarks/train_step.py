"""Training-step benchmark: forward + backward + Adam of an MLP, ringflow vs a hand-written
numpy step (the floor an interpreter can reach) vs PyTorch eager (default and fused Adam).

Shapes: A = 1024 -> 4 x 1024 -> 10, batch 256; B = 1024 -> 4 x 4096 -> 10, batch 64;
float32, softmax cross-entropy (mean), Adam(lr 1e-3, 0.9, 0.999, 1e-8), one fixed batch.
Every contender run is its own subprocess with OPENBLAS/OMP/MKL_NUM_THREADS set before
numpy is imported; rounds run every (contender, shape, threads) once in a shuffled order;
the table shows medians of the per-run medians, the ratio to the numpy floor, the load the
other processes of the machine put on it during each run, and ringflow's executor overhead
(step wall time minus the sum of its kernels' time, from ``Executor(profile=True)``).

    python benchmarks/train_step.py [--rounds 3] [--out benchmarks/results/train_step.md]

PyTorch (torch==2.13.0, CPU) lives only in its own venv, ``benchmarks/.venv-torch``, made
on first use (``--torch-python`` points elsewhere); it is never a project dependency.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCH_VENV = HERE / ".venv-torch"
SHAPES = {"A": (1024, 256), "B": (4096, 64)}  # hidden, batch
STEPS = {"A": (3, 12), "B": (2, 5)}            # warm-up, timed
# ringflow-2upd: ringflow with its optimizer update spread over 2 threads
# (RINGFLOW_NUM_THREADS=2, opt-in), to show what that adds; run at 2 BLAS threads only.
CONTENDERS = ("numpy", "ringflow", "ringflow-2upd", "torch", "torch-fused")
QUIET = 0.15  # a run is quiet when other processes used < 15 % of the machine's CPUs
LR, BETAS, EPS, DIN, NLAYERS, NCLS = 1e-3, (0.9, 0.999), 1e-8, 1024, 4, 10


# ------------------------------------------------------------------------------ contenders
def make_batch(np, batch: int):
    rng = np.random.default_rng(1)
    return rng.standard_normal((batch, DIN), dtype=np.float32), rng.integers(0, NCLS, batch)


class NumpyStep:
    """The floor: preallocated buffers, parameters / gradients / moments as flat vectors
    (layers are views), GEMMs with out=, Adam as in-place ufuncs over 64 Ki-element chunks
    (single-threaded, as numpy's ufuncs are)."""

    def __init__(self, np, hidden: int, batch: int, chunk: int = 65536) -> None:
        self.np, f32 = np, np.float32
        dims = [DIN] + [hidden] * NLAYERS + [NCLS]
        sizes = list(itertools.pairwise(dims))
        n = sum(a * b + b for a, b in sizes)
        self.flat = {k: np.zeros(n, f32) for k in ("p", "g", "m", "v")}
        self.tmp, self.chunk, self.t = np.empty(chunk, f32), chunk, 0
        self.W, self.b, self.dW, self.db, off = [], [], [], [], 0
        rng = np.random.default_rng(0)
        for a, b in sizes:
            for store, gstore, shape in ((self.W, self.dW, (a, b)), (self.b, self.db, (b,))):
                size = int(np.prod(shape))
                store.append(self.flat["p"][off:off + size].reshape(shape))
                gstore.append(self.flat["g"][off:off + size].reshape(shape))
                off += size
            self.W[-1][...] = rng.uniform(-a ** -0.5, a ** -0.5, (a, b))
        self.h = [np.empty((batch, d), f32) for d in dims[1:]]
        self.dh = [np.empty((batch, d), f32) for d in dims[1:]]
        self.mask = [np.empty((batch, d), bool) for d in dims[1:]]
        self.rows = np.arange(batch)

    def step(self, x, y) -> float:
        np, h, L = self.np, self.h, len(self.W)
        for i in range(L):
            np.matmul(x if i == 0 else h[i - 1], self.W[i], out=h[i])
            h[i] += self.b[i]
            if i < L - 1:
                np.maximum(h[i], 0, out=h[i])
        logits, d = h[-1], self.dh[-1]
        np.subtract(logits, logits.max(axis=1, keepdims=True), out=d)
        np.exp(d, out=d)
        total = d.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(total[:, 0]) - np.log(d[self.rows, y])))
        d /= total
        d[self.rows, y] -= 1.0
        d *= 1.0 / len(y)
        for i in reversed(range(L)):
            np.matmul((x if i == 0 else h[i - 1]).T, d, out=self.dW[i])
            np.sum(d, axis=0, out=self.db[i])
            if i:
                prev = self.dh[i - 1]
                np.matmul(d, self.W[i].T, out=prev)
                np.greater(h[i - 1], 0, out=self.mask[i - 1])
                np.multiply(prev, self.mask[i - 1], out=prev)
                d = prev
        self.adam()
        return loss

    def adam(self) -> None:
        np, f = self.np, self.flat
        self.t += 1
        lr_t = LR * (1 - BETAS[1] ** self.t) ** 0.5 / (1 - BETAS[0] ** self.t)
        eps_t = EPS * (1 - BETAS[1] ** self.t) ** 0.5
        for s in range(0, f["p"].size, self.chunk):
            p, g, m, v = (f[k][s:s + self.chunk] for k in "pgmv")
            t = self.tmp[:p.size]
            m *= BETAS[0]
            np.multiply(g, 1 - BETAS[0], out=t)
            m += t                                   # m = b1 m + (1 - b1) g
            v *= BETAS[1]
            np.multiply(g, g, out=t)
            t *= 1 - BETAS[1]
            v += t                                   # v = b2 v + (1 - b2) g^2
            np.sqrt(v, out=t)
            t += eps_t
            np.divide(m, t, out=t)
            t *= lr_t
            p -= t                                   # 12 passes over a cached chunk


class RingflowStep:
    """The same model as a ringflow program: fc layers, Adam via ``minimize``."""

    def __init__(self, np, hidden: int, batch: int, profile: bool = False) -> None:
        import ringflow as rf

        self.main, startup = rf.Program(), rf.Program()
        self.main.random_seed = 0
        with rf.program_guard(self.main, startup):
            x = rf.data("x", shape=[-1, DIN], dtype="float32")
            y = rf.data("y", shape=[-1], dtype="int64")
            h = x
            for _ in range(NLAYERS):
                h = rf.nn.fc(h, hidden, activation="relu")
            logits = rf.nn.fc(h, NCLS)
            self.loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))
            rf.optimizer.Adam(LR, beta1=BETAS[0], beta2=BETAS[1], epsilon=EPS).minimize(
                self.loss)
        self.scope = rf.Scope()
        self.exe = rf.Executor(profile=profile)
        self.exe.run(startup, scope=self.scope)

    def step(self, x, y) -> float:
        out, = self.exe.run(self.main, feed={"x": x, "y": y}, fetch_list=[self.loss],
                            scope=self.scope)
        return float(out.reshape(-1)[0])


def torch_step(hidden: int, batch: int, fused: bool):
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dims = [DIN] + [hidden] * NLAYERS + [NCLS]
    layers = []
    for a, b in itertools.pairwise(dims):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                           fused=True if fused else None)
    xn, yn = make_batch(np, batch)
    x, y = torch.from_numpy(xn), torch.from_numpy(yn)

    def step(_x, _y) -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def run_worker(args) -> None:
    """One contender, one shape, one thread count: prints one JSON record."""
    warmup, steps = STEPS[args.shape]
    hidden, batch = SHAPES[args.shape]
    rec = {"contender": args.worker, "shape": args.shape, "threads": args.threads}
    if args.worker.startswith("torch"):
        step = torch_step(hidden, batch, fused=args.worker == "torch-fused")
        x = y = None
    else:
        import numpy as np

        if args.worker == "ringflow-2upd":
            os.environ["RINGFLOW_NUM_THREADS"] = "2"
        cls = NumpyStep if args.worker == "numpy" else RingflowStep
        step = cls(np, hidden, batch).step
        x, y = make_batch(np, batch)
    times = []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        rec["loss"] = step(x, y)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    rec["step_ms"] = [1e3 * t for t in times]
    if args.worker.startswith("ringflow"):
        rec.update(profile_ringflow(hidden, batch, warmup, steps))
    print(json.dumps(rec), flush=True)


def profile_ringflow(hidden: int, batch: int, warmup: int, steps: int) -> dict:
    """Kernel time per op type and the executor's overhead (wall minus kernels), measured
    on a separate model with ``Executor(profile=True)``."""
    import numpy as np

    model = RingflowStep(np, hidden, batch, profile=True)
    x, y = make_batch(np, batch)
    for _ in range(warmup):
        model.step(x, y)
    model.exe.reset_profile()
    t0 = time.perf_counter()
    for _ in range(steps):
        model.step(x, y)
    wall = (time.perf_counter() - t0) / steps
    per_type = {k: 1e3 * v[1] / steps for k, v in model.exe.profile_stats().items()}
    kernels = sum(per_type.values())
    return {"prof_wall_ms": 1e3 * wall, "kernel_ms": kernels,
            "overhead_ms": 1e3 * wall - kernels, "by_type_ms": per_type}


# ---------------------------------------------------------------------------------- driver
def ensure_torch_python(path: str | None) -> str:
    if path:
        return path
    py = TORCH_VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {TORCH_VENV} with torch==2.13.0 (CPU), once", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TORCH_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "torch==2.13.0",
                        "numpy", "threadpoolctl"], check=True)
    return str(py)


def busy_seconds() -> float:
    """CPU-seconds all processes of the machine have used (from /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_quiet(budget: float, threshold: float = 0.10) -> float:
    """Waits (at most ``budget`` s) until the machine's CPUs were < ``threshold`` busy over
    one second; returns the busy share last seen. Runs started in a lull are more often
    quiet on a machine shared with others."""
    deadline, share = time.monotonic() + budget, 1.0
    while True:
        b0 = busy_seconds()
        time.sleep(1.0)
        share = (busy_seconds() - b0) / os.cpu_count()
        if share < threshold or time.monotonic() >= deadline:
            return share


def run_one(python: str, contender: str, shape: str, threads: int, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("RINGFLOW_NUM_THREADS", None)  # ringflow's default: one update thread
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    cmd = [python, str(Path(__file__).resolve()), "--worker", contender, "--shape", shape,
           "--threads", str(threads)]
    busy0, t0 = busy_seconds(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(
            f"{contender} {shape} t{threads}: no result within {timeout} s") from None
    wall, busy = time.perf_counter() - t0, busy_seconds() - busy0
    if proc.returncode != 0:
        raise RuntimeError(f"{contender} {shape} t{threads} exited {proc.returncode}:\n{err}")
    rec = json.loads(out.strip().splitlines()[-1])
    child = os.times()  # children's CPU so far; the difference is this child's
    rec["child_cpu"] = child.children_user + child.children_system
    rec["wall_s"], rec["busy_s"] = wall, busy
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="A", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="A,B")
    ap.add_argument("--thread-counts", default="1,2")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--torch-python", default=None)
    ap.add_argument("--also", action="append", default=[],
                    help="records (.jsonl) of an earlier run of this script to pool in")
    ap.add_argument("--wait-quiet", type=float, default=30.0,
                    help="seconds to wait for a lull before each run (0: don't)")
    ap.add_argument("--out", default=str(HERE / "results" / "train_step.md"))
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)
    contenders = args.contenders.split(",")
    torch_py = ensure_torch_python(args.torch_python) if any(
        c.startswith("torch") for c in contenders) else None
    cases = [(c, s, int(t)) for c in contenders for s in args.shapes.split(",")
             for t in args.thread_counts.split(",") if not (c == "ringflow-2upd" and t == "1")]
    records, load = [], [Path("/proc/loadavg").read_text().split()[:3]]
    prev_child = os.times().children_user + os.times().children_system
    for r in range(args.rounds):
        order = cases[:]
        random.Random(r).shuffle(order)
        for c, s, t in order:
            py = torch_py if c.startswith("torch") else sys.executable
            if args.wait_quiet > 0:
                wait_quiet(args.wait_quiet)
            rec = run_one(py, c, s, t, timeout=900)
            rec["child_cpu"], prev_child = rec["child_cpu"] - prev_child, rec["child_cpu"]
            rec["foreign"] = max(0.0, rec["busy_s"] - rec["child_cpu"]) / (
                rec["wall_s"] * os.cpu_count())
            rec["round"] = r
            records.append(rec)
            print(f"round {r} {c:12s} {s} t{t}: {statistics.median(rec['step_ms']):8.1f} ms"
                  f"  foreign load {rec['foreign']:.2f}", flush=True)
        load.append(Path("/proc/loadavg").read_text().split()[:3])
    rounds = args.rounds
    for extra in args.also:
        earlier = [json.loads(line) for line in Path(extra).read_text().splitlines() if line]
        rounds += len({r["round"] for r in earlier})
        records = earlier + records
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_description(), "loadavg": load, "rounds": rounds}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = render(records, meta)
    out.write_text(text)
    print(text)


def machine_description() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    import numpy

    return (f"{os.cpu_count()} x {cpu}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, numpy {numpy.__version__}")


def _agg(recs: list[dict]) -> tuple[float, int, int, float]:
    """Median of the per-run medians over quiet runs (other processes used < 15 % of the
    machine), or over all runs when none was quiet; (ms, n used, n runs, median load)."""
    quiet = [r for r in recs if r["foreign"] < QUIET]
    med = statistics.median(statistics.median(r["step_ms"]) for r in quiet or recs)
    return med, len(quiet), len(recs), statistics.median(r["foreign"] for r in recs)


def render(records: list[dict], meta: dict) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["shape"], r["contender"], r["threads"]), []).append(r)
    threads = sorted({k[2] for k in groups})
    head = " | ".join(f"{t} thr ms | vs floor" for t in threads)
    lines = [f"Measured {meta['date']} on {meta['machine']}; {meta['rounds']} interleaved "
             f"rounds; /proc/loadavg before and after each round: "
             f"{', '.join('/'.join(x) for x in meta['loadavg'])}.", "",
             "Step time = median over runs of each run's median step; only quiet runs (other "
             f"processes used < {QUIET:.0%} of the CPUs) count, * = no quiet run, all runs "
             "used. Other load = median share of the CPUs other processes used during a run.",
             "",
             f"| shape | contender | {head} | quiet runs | other load |",
             "|---|---|" + "---:|---:|" * len(threads) + "---:|---:|"]
    for shape, (hidden, batch) in SHAPES.items():
        for c in CONTENDERS:
            cells, quiet, load = [], [], []
            for t in threads:
                recs = groups.get((shape, c, t))
                if not recs:
                    cells.append(" | ")
                    continue
                ms, nq, n, fl = _agg(recs)
                floor = groups.get((shape, "numpy", t))
                ratio = f"{ms / _agg(floor)[0]:.2f}x" if floor else ""
                cells.append(f"{ms:.1f}{'' if nq else '*'} | {ratio}")
                quiet.append(f"{nq}/{n}")
                load.append(f"{fl:.2f}")
            if quiet:
                lines.append(f"| {shape}: h={hidden}, B={batch} | {c} | {' | '.join(cells)} "
                             f"| {' '.join(quiet)} | {' '.join(load)} |")
    lines += ["", "ringflow executor, `Executor(profile=True)` (medians over quiet runs):", "",
              "| shape | threads | contender | step ms (profiled) | kernels ms | overhead ms | "
              "largest kernels (ms per step) |", "|---|---:|---|---:|---:|---:|---|"]
    for (shape, c, t), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2],
                                                                       kv[0][1])):
        if not c.startswith("ringflow"):
            continue
        recs = [r for r in recs if r["foreign"] < QUIET] or recs
        med = {k: statistics.median(r[k] for r in recs)
               for k in ("prof_wall_ms", "kernel_ms", "overhead_ms")}
        by_type: dict[str, list[float]] = {}
        for r in recs:
            for k, v in r["by_type_ms"].items():
                by_type.setdefault(k, []).append(v)
        top = sorted(((statistics.median(v), k) for k, v in by_type.items()), reverse=True)
        lines.append(f"| {shape} | {t} | {c} | {med['prof_wall_ms']:.1f} | "
                     f"{med['kernel_ms']:.1f} | {med['overhead_ms']:.2f} | "
                     + ", ".join(f"{k} {v:.1f}" for v, k in top[:5]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
