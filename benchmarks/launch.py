"""Launch-overhead benchmark (issue 8): wall time from spawning a launcher to a 2-rank job's
first logged training step (or first all-reduce), and to the launcher's exit; ringflow's
launcher beside torchrun (the anchor), in one run, rounds interleaved.

    python benchmarks/launch.py [--rounds 7] [--out benchmarks/launch.jsonl]

Clock: ``time.monotonic()`` just before ``Popen`` of the launcher is 0; a line's time is when
a reader thread got it from the launcher's stdout (stderr merged); exit is when ``wait``
returns. Workers stamp their phases with the same clock (CLOCK_MONOTONIC is system-wide on
Linux), and their spawn time comes from /proc/self/stat, so each run also says where its
time went. Rows: ``ringflow.launch -m ringflow.train`` of the default MLP (tensor parallel
degree 1 and 2) against torchrun + DDP of the same MLP; the launcher with a bare worker (one
all-reduce) against torchrun + gloo (one all_reduce); a probe (this file as the worker,
running ringflow.train's own functions, timed); single-process imports for scale. Every
round runs every row once in a shuffled order, after a lull of at most ``--wait-quiet`` s;
``foreign`` is the CPU share other processes took during a run (the machine is shared).

PyTorch lives only in ``benchmarks/.venv-torch`` (train_step.py's helper makes it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0_VAR = "RINGFLOW_BENCH_T0"  # the driver's clock at Popen, for the workers' phase stamps
SPEC = {"model": "mlp", "steps": 20, "log_every": 1, "checkpoint_dir": None,
        "tensor_parallel_degree": 1}
TIMEOUT_S, QUIET = 60.0, 0.15
ALLREDUCE_DONE = "first all-reduce done"
PHASES = "[phases] "


# ------------------------------------------------------------------------------- workers
class Phases:
    """A worker's timestamps since the driver's Popen, printed as one ``[phases]`` line."""

    def __init__(self) -> None:
        self.t0 = float(os.environ.get(T0_VAR, "nan"))
        self.marks = {"spawned": _spawned_at() - self.t0}
        self.mark("interpreter up")

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic() - self.t0

    def emit(self, rank: int) -> None:
        # one write(2) of a whole line: torchrun's ranks share one pipe
        sys.stdout.flush()
        line = PHASES + json.dumps({"rank": rank, "marks": self.marks}) + "\n"
        os.write(sys.stdout.fileno(), line.encode())


def _spawned_at() -> float:
    """This process's start on the monotonic clock (/proc starttime, clock ticks of 10 ms)."""
    stat = Path("/proc/self/stat").read_text()
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    boot_minus_mono = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    return ticks / os.sysconf("SC_CLK_TCK") - boot_minus_mono


def worker_rf_allreduce(ph: Phases) -> None:
    import numpy as np

    import ringflow.distributed as dist
    ph.mark("imports")
    dist.init_parallel_env()
    ph.mark("init_parallel_env")
    x = np.ones(1024, dtype=np.float32)
    dist.all_reduce(x)
    ph.mark("first all-reduce")
    if dist.get_rank() == 0:
        print(f"{ALLREDUCE_DONE}: {x[0]:g}", flush=True)
    dist.destroy_process_group()
    ph.emit(dist.get_rank())


def worker_rf_train_probe(ph: Phases, spec_path: str) -> int:
    """``python -m ringflow.train SPEC`` with marks: the same main(), its steps wrapped."""
    import numpy  # noqa: F401 - timed on its own

    ph.mark("numpy")
    from ringflow.train import __main__ as train_main
    from ringflow.train import metrics, worker
    ph.mark("ringflow.train imports")
    calls = {"start_clock": 0}

    def after(name, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            ph.mark(name)
            return out
        return wrapped

    def start_clock(self, original=metrics.Reporter.start_clock):
        original(self)
        calls["start_clock"] += 1
        if calls["start_clock"] == 2:  # the second call: the startup program has run
            ph.mark("startup program (rings, broadcast)")

    def step_done(self, step, *args, original=metrics.Reporter.step_done):
        original(self, step, *args)
        if step == 1:
            ph.mark("step 1")

    worker.read_layout = after("spec + fleet.init", worker.read_layout)
    worker.build_job = after("program built + rewritten", worker.build_job)
    metrics.Reporter.start_clock, metrics.Reporter.step_done = start_clock, step_done
    code = train_main.main([spec_path])
    ph.emit(int(os.environ.get("PADDLE_TRAINER_ID", "0")))
    return code


def worker_torch_allreduce(ph: Phases) -> None:
    import torch
    import torch.distributed as dist
    ph.mark("imports")
    dist.init_process_group("gloo")
    ph.mark("init_process_group")
    t = torch.ones(1024)
    dist.all_reduce(t)
    ph.mark("first all-reduce")
    if dist.get_rank() == 0:
        print(f"{ALLREDUCE_DONE}: {t[0].item():g}", flush=True)
    dist.destroy_process_group()
    ph.emit(int(os.environ["RANK"]))


def worker_torch_ddp(ph: Phases) -> None:
    """ringflow's default MLP in torch: 64 -> 256 -> ReLU -> 10, Adam 1e-3, global batch 32
    over 2 ranks, 20 steps, rank 0 logging the dp-averaged loss of every step as
    ringflow.train does (its metric-line format)."""
    import torch
    import torch.distributed as dist
    ph.mark("imports")
    dist.init_process_group("gloo")
    ph.mark("init_process_group")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(64, 10, generator=torch.Generator().manual_seed(1))
    ph.mark("DDP model built")
    for step in range(1, SPEC["steps"] + 1):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(32, 64, generator=gen)[rank * 16:(rank + 1) * 16]
        loss = torch.nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.detach().clone()
        dist.all_reduce(value)
        if rank == 0:
            line = {"step": step, "loss": value.item() / world, "lr": 1e-3}
            print("[train] metric " + json.dumps(line), flush=True)
        if step == 1:
            ph.mark("step 1")
    dist.destroy_process_group()
    ph.emit(rank)


WORKERS = {"rf-allreduce": worker_rf_allreduce, "rf-train-probe": worker_rf_train_probe,
           "torch-allreduce": worker_torch_allreduce, "torch-ddp": worker_torch_ddp}


# -------------------------------------------------------------------------------- driver
@dataclass
class Row:
    name: str
    argv: list[str]
    until: str  # "metric" | "allreduce" | "" (exit only)
    anchor: str | None = None  # the row whose times this one is compared with


@dataclass
class Run:
    row: str
    t_first_s: float | None
    t_exit_s: float
    returncode: int
    lines: list[tuple[float, str]] = field(default_factory=list)
    unix_t0: float = 0.0  # time.time() at Popen, for the launcher's unix timestamps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_rows(tmp: Path, torch_py: str) -> list[Row]:
    rf, me = [sys.executable], str(Path(__file__).resolve())
    launch = [*rf, "-m", "ringflow.launch", "--nproc-per-host", "2", "--log-dir"]
    specs = {}
    for degree in (1, 2):
        specs[degree] = tmp / f"spec-tp{degree}.json"
        specs[degree].write_text(json.dumps({**SPEC, "tensor_parallel_degree": degree}))
    torchrun = [str(Path(torch_py).parent / "torchrun"), "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", "{port}"]
    ddp, gloo = "torchrun DDP mlp", "torchrun gloo all-reduce"
    return [
        Row("ringflow.train mlp, tp 1", [*launch, "{logs}", "-m", "ringflow.train",
                                         str(specs[1])], "metric", ddp),
        Row("ringflow.train mlp, tp 2", [*launch, "{logs}", "-m", "ringflow.train",
                                         str(specs[2])], "metric", ddp),
        Row("ringflow.train mlp, tp 1, phase probe",
            [*launch, "{logs}", me, "--worker", "rf-train-probe", str(specs[1])], "metric", ddp),
        Row(ddp, [*torchrun, me, "--worker", "torch-ddp"], "metric"),
        Row("ringflow launch, bare all-reduce",
            [*launch, "{logs}", me, "--worker", "rf-allreduce"], "allreduce", gloo),
        Row(gloo, [*torchrun, me, "--worker", "torch-allreduce"], "allreduce"),
        Row("1 process: import ringflow.train.worker",
            [*rf, "-c", "import ringflow.train.worker"], "", "1 process: import torch"),
        Row("1 process: import torch", [torch_py, "-c", "import torch"], ""),
        Row("1 process: python -c pass", [*rf, "-c", "pass"], ""),
    ]


def child_env() -> dict[str, str]:
    """Each launcher applies its own defaults (threads per rank, job identity)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(k, None)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def is_marker(until: str, line: str) -> bool:
    if until == "metric":
        from ringflow.train.metrics import parse_train_line

        parsed = parse_train_line(line)
        return parsed is not None and parsed[0] == "metric"
    return until == "allreduce" and ALLREDUCE_DONE in line


def run_once(row: Row, tmp: Path) -> Run:
    logs = tempfile.mkdtemp(dir=tmp, prefix="logs-")
    argv = [a.format(logs=logs, port=free_port()) for a in row.argv]
    env = child_env()
    unix_t0, t0 = time.time(), time.monotonic()
    env[T0_VAR] = repr(t0)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for raw in proc.stdout:
            lines.append((time.monotonic() - t0, raw.decode("utf-8", "replace").rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise RuntimeError(f"{row.name}: not done within {TIMEOUT_S:g} s; killed") from None
    t_exit = time.monotonic() - t0
    reader.join(timeout=10.0)
    first = next((t for t, line in lines if row.until and is_marker(row.until, line)), None)
    if proc.returncode != 0 or (row.until and first is None):
        tail = "\n".join(line for _, line in lines[-20:])
        raise RuntimeError(f"{row.name}: exit {proc.returncode}, marker "
                           f"{'seen' if first is not None else 'missing'}:\n{tail}")
    return Run(row.name, first, t_exit, proc.returncode, lines, unix_t0)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's group (ringflow's stops its ranks; torchrun's share the group),
    SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def phases_of(run: Run) -> dict[str, float]:
    """Every worker's phase marks (per mark the slower rank: it gates the job) and what the
    launcher's stdout shows: ranks spawned, first and last [train] line, when the launcher
    saw the last rank exit (its result line's ``ended_at``), the result line, the exit."""
    from ringflow.train.metrics import parse_train_line

    out: dict[str, float] = {}
    for t, line in run.lines:
        parsed = parse_train_line(line)
        if parsed is not None:
            out.setdefault(f"first {parsed[0]} line", t)
        elif line.startswith("[launch] job "):
            out.setdefault("launcher: ranks spawned", t)
        elif line.startswith("[launch] result "):
            ended = [r["ended_at"] or 0.0
                     for r in json.loads(line[len("[launch] result "):])["ranks"]]
            out["launcher: saw the last rank exit"] = max(ended) - run.unix_t0
            out["launcher: result line"] = t
        elif ALLREDUCE_DONE in line:
            out.setdefault("first all-reduce line", t)
        out.update(_worker_marks(run.row, line, out))
    out["launcher exit"] = run.t_exit_s
    return out


def _worker_marks(row: str, line: str, seen: dict[str, float]) -> dict[str, float]:
    body = line.split("] ", 1)[1] if line.startswith("[rank ") else line
    if not body.startswith(PHASES):
        return {}
    try:
        marks = json.JSONDecoder().raw_decode(body, len(PHASES))[0]["marks"]
    except (ValueError, KeyError):  # garbled: a line of another rank written into it
        print(f"{row}: unreadable phase line {line!r}", file=sys.stderr)
        return {}
    return {f"rank: {name}": max(seen.get(f"rank: {name}", value), value)
            for name, value in marks.items()}


def measure(row: Row, tmp: Path, rnd: int, wait_quiet_s: float) -> dict:
    from train_step import busy_seconds, wait_quiet

    if wait_quiet_s > 0:
        wait_quiet(wait_quiet_s)
    cpu0, busy0, t0 = _children_cpu(), busy_seconds(), time.monotonic()
    run = run_once(row, tmp)
    wall, busy, own = time.monotonic() - t0, busy_seconds() - busy0, _children_cpu() - cpu0
    return {"bench": "launch", "row": row.name, "round": rnd, "t_first_s": run.t_first_s,
            "t_exit_s": run.t_exit_s, "phases_s": phases_of(run),
            "foreign": max(0.0, busy - own) / (wall * os.cpu_count())}


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def summarize(rows: list[Row], records: list[dict]) -> str:
    by = {r.name: [x for x in records if x["row"] == r.name] for r in rows}

    def med(name: str, key: str) -> float | None:
        vals = [x[key] for x in by[name] if x[key] is not None]
        return statistics.median(vals) if vals else None

    out = ["| row | until | median s | min s | max s | vs anchor | quiet runs: median s (n) "
           "| foreign load |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for key, until in (("t_first_s", {"metric": "first metric line",
                                          "allreduce": "first all-reduce"}.get(r.until)),
                           ("t_exit_s", "launcher exit" if r.until else "exit")):
            if until is None or not by[r.name]:
                continue
            vals = [x[key] for x in by[r.name]]
            quiet = [x[key] for x in by[r.name] if x["foreign"] < QUIET]
            anchor = med(r.anchor, key) if r.anchor else None
            ratio = f"{statistics.median(vals) / anchor:.2f} x {r.anchor}" if anchor else ""
            q = f"{statistics.median(quiet):.2f} ({len(quiet)})" if quiet else "- (0)"
            load = statistics.median(x["foreign"] for x in by[r.name])
            out.append(f"| {r.name} | {until} | {statistics.median(vals):.2f} | {min(vals):.2f}"
                       f" | {max(vals):.2f} | {ratio} | {q} | {load:.2f} |")
    return "\n".join(out)


def summarize_phases(rows: list[Row], records: list[dict]) -> str:
    """Median time since Popen at which each phase ended (all runs), and its increment."""
    out = []
    for r in rows:
        runs = [x["phases_s"] for x in records if x["row"] == r.name]
        if not r.until or not runs:  # single processes: their exit is all there is
            continue
        names = sorted({n for p in runs for n in p}, key=lambda n: statistics.median(
            p[n] for p in runs if n in p))
        out += [f"\n{r.name} ({len(runs)} runs): phase ends, median s since Popen", "",
                "| phase | at s | +s |", "|---|---:|---:|"]
        prev = 0.0
        for n in names:
            at = statistics.median(p[n] for p in runs if n in p)
            out.append(f"| {n} | {at:.3f} | {at - prev:+.3f} |")
            prev = at
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--wait-quiet", type=float, default=3.0,
                    help="at most this many seconds waiting for a lull before each run")
    ap.add_argument("--torch-python", default=None)
    ap.add_argument("--out", default=str(HERE / "launch.jsonl"))
    args = ap.parse_args()
    if args.worker:
        ph = Phases()
        fn = WORKERS[args.worker]
        return (fn(ph, args.spec) if args.spec else fn(ph)) or 0
    from train_step import ensure_torch_python

    torch_py = ensure_torch_python(args.torch_python)
    records: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-launch-") as tmp:
        rows = make_rows(Path(tmp), torch_py)
        for row in rows:  # warm the page cache; not recorded
            run_once(row, Path(tmp))
        for rnd in range(args.rounds):
            order = rows[:]
            random.Random(rnd).shuffle(order)
            for row in order:
                records.append(measure(row, Path(tmp), rnd, args.wait_quiet))
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{x['row']} {x['t_first_s'] or x['t_exit_s']:.2f}"
                for x in records[-len(rows):]), flush=True)
    with open(args.out, "w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    print(f"\n{os.cpu_count()} CPUs, {args.rounds} rounds, raw records: {args.out}\n")
    print(summarize(rows, records))
    print(summarize_phases(rows, records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
