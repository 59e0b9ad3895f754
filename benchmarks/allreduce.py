"""All-reduce benchmark (not a test): ringflow over shared memory and over TCP against the
anchors a user would pick instead (torch.distributed gloo, Open MPI through mpi4py over shared
memory and over TCP) and the limits (memcpy with every rank copying, a raw two-way socket
stream), interleaved in rounds, in one run. Prints size, time, algbw and busbw (nccl-tests:
busbw = algbw * 2(n-1)/n), writes JSON lines, a markdown table and a PNG plot.

    .venv/bin/python benchmarks/allreduce.py [--nprocs 2] [--rounds 3] [--readme]

The anchors run from a benchmark-only venv (benchmarks/.venv-torch: torch==2.13.0, mpi4py,
matplotlib; created here if missing) and Debian's openmpi-bin; missing ones are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "allreduce_workers.py"
BENCH_VENV = HERE / ".venv-torch"
BENCH_PY = BENCH_VENV / "bin" / "python"
RESULTS = HERE / "results"
KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, 256 * KiB, MiB, 16 * MiB, 64 * MiB, 256 * MiB]
ORDER = ["ringflow-shm", "ringflow-shm-inplace", "ringflow-tcp", "gloo", "mpi", "mpi-tcp",
         "memcpy", "tcpstream"]


def free_ports(count: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def contract_env(rank: int, n: int, ports: list[int], job: tuple[str, str],
                 extra: dict[str, str]) -> dict[str, str]:
    eps = [f"127.0.0.1:{p}" for p in ports]
    return dict(os.environ, PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM=str(n),
                PADDLE_TRAINER_ENDPOINTS=",".join(eps), PADDLE_CURRENT_ENDPOINT=eps[rank],
                PADDLE_RANK_IN_NODE=str(rank), PADDLE_LOCAL_SIZE=str(n), OMP_NUM_THREADS="1",
                RINGFLOW_JOB_ID=job[0], RINGFLOW_JOB_TOKEN=job[1], PYTHONUNBUFFERED="1",
                **extra)


def spawn_ranks(python: str, backend: str, n: int, sizes: list[int],
                extra: dict[str, str]) -> list[dict]:
    """n worker processes with the env contract; returns rank 0's JSON records."""
    ports, job = free_ports(n + 1), (f"bench{secrets.token_hex(3)}", secrets.token_hex(16))
    procs = []
    try:
        for rank in range(n):
            env = contract_env(rank, n, ports[:n], job,
                               dict(extra, BENCH_MASTER=f"127.0.0.1:{ports[n]}"))
            procs.append(subprocess.Popen(
                [python, str(WORKER), backend, ",".join(map(str, sizes))], env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                start_new_session=True, text=True))
        out, _ = procs[0].communicate(timeout=1200)
        for p in procs[1:]:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_mpi(n: int, sizes: list[int], tcp: bool) -> list[dict]:
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]
    if tcp:
        cmd += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
    cmd += ["-x", f"BENCH_LABEL={'mpi-tcp' if tcp else 'mpi'}", str(BENCH_PY), str(WORKER),
            "mpi", ",".join(map(str, sizes))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                         env=dict(os.environ, BENCH_LABEL="mpi-tcp" if tcp else "mpi")).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def ensure_bench_venv() -> bool:
    """The anchors' venv; created only if missing (the train benchmark shares it)."""
    if not BENCH_PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    probe = subprocess.run([str(BENCH_PY), "-c", "import torch, mpi4py, matplotlib"],
                           capture_output=True)
    if probe.returncode:
        subprocess.run([str(BENCH_PY), "-m", "pip", "install", "-q", "torch==2.13.0", "numpy",
                        "mpi4py", "matplotlib"], check=False)
    probe = subprocess.run([str(BENCH_PY), "-c", "import torch"], capture_output=True)
    return probe.returncode == 0


def one_round(n: int, sizes: list[int], backends: set[str]) -> list[dict]:
    py, recs = sys.executable, []
    if "ringflow-shm" in backends:
        recs += spawn_ranks(py, "ringflow", n, sizes, {})
    if "ringflow-shm-inplace" in backends:
        recs += spawn_ranks(py, "ringflow-inplace", n, sizes, {})
    if "ringflow-tcp" in backends:
        recs += spawn_ranks(py, "ringflow", n, sizes, {"RINGFLOW_TRANSPORT": "tcp"})
    if "gloo" in backends:
        recs += spawn_ranks(str(BENCH_PY), "gloo", n, sizes, {})
    if "mpi" in backends:
        recs += run_mpi(n, sizes, tcp=False)
    if "mpi-tcp" in backends:
        recs += run_mpi(n, sizes, tcp=True)
    if "memcpy" in backends:
        recs += spawn_ranks(py, "memcpy", n, sizes, {})
    if "tcpstream" in backends and n == 2:
        recs += spawn_ranks(py, "tcpstream", 2, sizes, {})
    return recs


def summarize(records: list[dict]) -> dict[tuple[str, int], dict]:
    """Median over rounds of each (backend, size), with the min..max of busbw."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        groups.setdefault((r["backend"], r["size"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        bus = [r["busbw"] for r in rs]
        out[key] = {"time_us": statistics.median(r["time_us"] for r in rs),
                    "algbw": statistics.median(r["algbw"] for r in rs),
                    "busbw": statistics.median(bus), "min": min(bus), "max": max(bus),
                    "rounds": len(rs), "n": rs[0]["n"],
                    "correct": all(r.get("correct", True) for r in rs)}
    return out


def size_label(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


def markdown(summary: dict, n: int, sizes: list[int]) -> str:
    lines = [f"| backend (n={n}) | size | time (us) | algbw GB/s | busbw GB/s | busbw min..max |",
             "|---|---:|---:|---:|---:|---:|"]
    for backend in ORDER:
        for size in sizes:
            s = summary.get((backend, size))
            if s is None:
                continue
            flag = "" if s["correct"] else " (WRONG RESULT)"
            lines.append(f"| {backend}{flag} | {size_label(size)} | {s['time_us']:.1f} | "
                         f"{s['algbw']:.3f} | {s['busbw']:.3f} | {s['min']:.2f}..{s['max']:.2f} |")
    return "\n".join(lines)


GOALS = [  # (what, numerator, denominator, size, goal) on busbw; 4 KiB is a time goal
    ("shm 64 MiB vs Open MPI shm", "ringflow-shm", "mpi", 64 * MiB, 1.5),
    ("shm 64 MiB vs gloo", "ringflow-shm", "gloo", 64 * MiB, 2.0),
    ("shm 1 MiB vs Open MPI shm", "ringflow-shm", "mpi", MiB, 0.6),
    ("TCP 64 MiB vs Open MPI TCP", "ringflow-tcp", "mpi-tcp", 64 * MiB, 1.5),
    ("TCP 64 MiB vs raw two-way socket stream", "ringflow-tcp", "tcpstream", 64 * MiB, 0.7),
]


def goals(summary: dict) -> str:
    if any(v["n"] != 2 for v in summary.values()):
        return "(the goals are for 2 ranks)"
    lines = ["| goal (n=2, busbw ratio) | measured | goal | met |", "|---|---:|---:|:---:|"]
    for what, num, den, size, goal in GOALS:
        a, b = summary.get((num, size)), summary.get((den, size))
        if a and b:
            ratio = a["busbw"] / b["busbw"]
            met = "yes" if ratio >= goal else "no"
            lines.append(f"| {what} | {ratio:.2f}x | >= {goal}x | {met} |")
    small = summary.get(("ringflow-shm", 4 * KiB))
    if small:
        met = "yes" if small["time_us"] <= 25 else "no"
        lines.append(f"| shm 4 KiB time | {small['time_us']:.1f} us | <= 25 us | {met} |")
    return "\n".join(lines) + "\n\n" + goals_10(summary)


TIME_GOALS_10 = [(4 * KiB, 1.5), (64 * KiB, 1.0), (256 * KiB, 1.0)]  # shm time / Open MPI's
COPY_GOAL_10 = (0.9, [16 * MiB, 64 * MiB, 256 * MiB])  # shm busbw / memcpy's


def goals_10(summary: dict) -> str:
    """Issue #10's goals for the shared-memory collectives, in the same run."""
    lines = ["| goal of #10 (n=2) | measured | goal | met |", "|---|---:|---:|:---:|"]
    for size, goal in TIME_GOALS_10:
        a, b = summary.get(("ringflow-shm", size)), summary.get(("mpi", size))
        if a and b:
            ratio = a["time_us"] / b["time_us"]
            lines.append(f"| shm {size_label(size)} time vs Open MPI shm | {a['time_us']:.1f} vs "
                         f"{b['time_us']:.1f} us = {ratio:.2f}x | <= {goal}x | "
                         f"{'yes' if ratio <= goal else 'no'} |")
    goal, sizes = COPY_GOAL_10
    for backend, how in (("ringflow-shm", "private buffers"),
                         ("ringflow-shm-inplace", "buffers from comm.shared_array")):
        for size in sizes:
            a, b = summary.get((backend, size)), summary.get(("memcpy", size))
            if a and b:
                ratio = a["busbw"] / b["busbw"]
                lines.append(f"| shm {size_label(size)} busbw vs the two-core copy limit, "
                             f"{how} | {ratio:.0%} | >= {goal:.0%} | "
                             f"{'yes' if ratio >= goal else 'no'} |")
    return "\n".join(lines)


def plot(summary: dict, n: int, sizes: list[int], path: Path) -> bool:
    script = (
        "import json, sys\nimport matplotlib\nmatplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n"
        "data, n, path = json.loads(sys.stdin.read()), int(sys.argv[1]), sys.argv[2]\n"
        "fig, ax = plt.subplots(figsize=(7, 4.2))\n"
        "for name, pts in data.items():\n"
        "    style = ':' if name in ('memcpy', 'tcpstream') else '-'\n"
        "    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker='o', label=name)\n"
        "ax.set_xscale('log', base=2); ax.set_yscale('log'); ax.set_xlabel('bytes per rank')\n"
        "ax.grid(alpha=.3, which='both')\n"
        "ax.set_ylabel('busbw GB/s (median)'); ax.legend(fontsize=8)\n"
        "ax.set_title(f'float32 SUM all-reduce, {n} ranks, 2-core VM')\n"
        "fig.tight_layout(); fig.savefig(path, dpi=110)\n")
    data = {b: [(s, summary[(b, s)]["busbw"]) for s in sizes if (b, s) in summary]
            for b in ORDER if any((b, s) in summary for s in sizes)}
    py = str(BENCH_PY) if BENCH_PY.exists() else sys.executable
    done = subprocess.run([py, "-c", script, str(n), str(path)], input=json.dumps(data),
                          text=True, capture_output=True)
    if done.returncode:
        print(f"plot skipped: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return done.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--backends", default=",".join(ORDER), help="comma-separated subset")
    ap.add_argument("--report", type=Path, help="only summarize this results .jsonl file")
    args = ap.parse_args()
    if args.report:
        records = [json.loads(x) for x in args.report.read_text().splitlines() if x.strip()]
        summary, n = summarize(records), records[0]["n"]
        sizes = sorted({r["size"] for r in records})
        plot(summary, n, sizes, HERE / f"allreduce-n{n}.png")
        print(markdown(summary, n, sizes) + "\n\n" + goals(summary))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    backends = set(args.backends.split(","))
    if backends & {"gloo", "mpi", "mpi-tcp"} and not ensure_bench_venv():
        backends -= {"gloo", "mpi", "mpi-tcp"}
    if shutil.which("mpirun") is None:
        backends -= {"mpi", "mpi-tcp"}
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    records = []
    for rnd in range(args.rounds):
        for rec in one_round(args.nprocs, sizes, backends):
            rec["round"] = rnd
            records.append(rec)
            print(f"round {rnd} {rec['backend']:>13} {size_label(rec['size']):>8} "
                  f"{rec['time_us']:10.1f} us  algbw {rec['algbw']:7.3f}  "
                  f"busbw {rec['busbw']:7.3f} GB/s", flush=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    (RESULTS / f"allreduce-{stamp}.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))
    summary = summarize(records)
    table = markdown(summary, args.nprocs, sizes)
    png = HERE / f"allreduce-n{args.nprocs}.png"
    plot(summary, args.nprocs, sizes, png)
    print(f"\nloadavg before {' '.join(load_before)}, after {' '.join(load_after)}; "
          f"{args.rounds} interleaved rounds; median over rounds\n")
    print(table + "\n\n" + goals(summary))


if __name__ == "__main__":
    main()
