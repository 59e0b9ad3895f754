"""The scaling model (scaling_model.py) calibrated, validated and projected (issue 19).

    python benchmarks/scaling.py measure [--shapes A,B] [--rounds 2]   # as root: ~15 min
    python benchmarks/scaling.py report [benchmarks/scaling.jsonl]

``measure`` writes benchmarks/scaling.jsonl: the calibration of each interpreter (the
checkout's .venv, and Debian's python3, which the namespace hosts run, here with the
.venv's numpy: Debian's numpy 1.24 has no optimised BLAS, 30x slower GEMMs), then,
in rounds, the step time of every data-parallel layout measurable here: 1, 2 and 4 ranks on
this host (shared memory or TCP between them; plain or sharded stage 1/2) and 2 namespace
hosts of tests/hosts.py (1 + 1 and 2 + 2 ranks). The calibration: one process's forward +
backward and update at each per-rank batch and thread count the layouts use
(train_parallel.py's worker, profiled), and the all-reduce time of each transport at 1, 4
and 16 MiB with 2 ranks (allreduce_workers.py), fitted to alpha and beta.

``report`` prints the prediction of every measured layout beside the measurement (goal:
within 15 %), the projection to 8-64 hosts x 8 ranks at 10, 25 and 100 Gb/s, and plots
the projection to benchmarks/scaling.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
import scaling_model as sm  # noqa: E402
import train_parallel as tp  # noqa: E402

OUT = HERE / "scaling.jsonl"
SIZES = [1 << 20, 4 << 20, 16 << 20]
HOST_PY = "/usr/bin/python3"
# the .venv's numpy for the hosts' python3 (same CPython 3.11 ABI): a folder of links to it
HOST_SITE = HERE / ".host-site"


def host_pythonpath() -> str:
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" \
        / "site-packages"
    HOST_SITE.mkdir(exist_ok=True)
    for name in ("numpy", "numpy.libs"):
        link = HOST_SITE / name
        if not link.exists():
            link.symlink_to(site / name)
    return f"{REPO / 'provider'}:{HOST_SITE}"
# (name, hosts, ranks per host, sharding stage, link between the ranks of a host)
LAYOUTS = [("1p", 1, 1, 0, "shm"), ("dp2-shm", 1, 2, 0, "shm"), ("dp2-tcp", 1, 2, 0, "tcp"),
           ("zero1-dp2-shm", 1, 2, 1, "shm"), ("zero2-dp2-shm", 1, 2, 2, "shm"),
           ("zero1-dp2-tcp", 1, 2, 1, "tcp"), ("dp4-shm", 1, 4, 0, "shm"),
           ("zero1-dp4-shm", 1, 4, 1, "shm"), ("dp-1+1", 2, 1, 0, "shm"),
           ("zero1-1+1", 2, 1, 1, "shm"), ("dp-2+2", 2, 2, 0, "shm"),
           ("zero1-2+2", 2, 2, 1, "shm")]
FOUR_RANKS_ONLY = ("A",)   # B with 4 full replicas on 2 cores takes minutes a run


# ------------------------------------------------------------------------------ measuring
def _one_process(py: str, shape: str, batch: int, threads: int, copies: int = 1) -> dict:
    """train_parallel.py's worker alone, ``copies`` of it at once, in lock step (a barrier
    before every step: a job's ranks meet at every collective, so they do their GEMMs and
    their updates at the same time, and contend for the memory bus as copies out of phase
    would not); the slowest copy's record (its median step)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    env.update(PYTHONPATH=host_pythonpath(), BENCH_BATCH=str(batch), BENCH_MP="1",
               OPENBLAS_THREAD_TIMEOUT="18", RINGFLOW_NUM_THREADS=str(threads),
               **{v: str(threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                              "MKL_NUM_THREADS")})
    with socket.create_server(("127.0.0.1", 0)) as server:
        if copies > 1:
            env["BENCH_LOCKSTEP"] = str(server.getsockname()[1])
            barrier = threading.Thread(target=_barrier, args=(server, copies), daemon=True)
            barrier.start()
        procs = [subprocess.Popen([py, str(HERE / "train_parallel.py"), "--worker", "ringflow",
                                   "--shape", shape], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True) for _ in range(copies)]
        recs = [json.loads(p.communicate(timeout=1800)[0].split("BENCH ", 1)[1]
                           .splitlines()[0]) for p in procs]
    return max(recs, key=lambda r: statistics.median(r["step_ms"]))


def _barrier(server: socket.socket, copies: int) -> None:
    """Release every copy's next step once all of them asked for it, until one is done."""
    server.settimeout(600)
    conns = [server.accept()[0] for _ in range(copies)]
    try:
        while all(conn.recv(1) for conn in conns):
            for conn in conns:
                conn.sendall(b"g")
    except OSError:
        pass
    finally:
        for conn in conns:
            conn.close()


def calibrate(py: str, label: str, shapes: list[str], hosts=None) -> list[dict]:
    recs = []
    for shape in shapes:
        batch = tp.SHAPES[shape][1]
        points = [(batch, 2, 1), (batch // 2, 1, 2)]
        if shape in FOUR_RANKS_ONLY:
            points.append((batch // 4, 1, 4))
        for b, t, k in points:
            tp.ts.wait_quiet(10.0)
            r = _one_process(py, shape, b, t, k)
            recs.append({"kind": "fb", "python": label, "shape": shape, "batch": b,
                         "threads": t, "copies": k, "params": r["params"],
                         "fb_ms": statistics.median(r["step_ms"]) - r["update_ms"],
                         "update_ms": r["update_ms"]})
    import allreduce as ar

    links = {"shm": ("ringflow-inplace", {}), "tcp": ("ringflow", {"RINGFLOW_TRANSPORT": "tcp"})}
    for name, (backend, extra) in links.items():
        if label == "venv":
            for r in ar.spawn_ranks(sys.executable, backend, 2, SIZES, extra):
                recs.append({"kind": "link", "python": label, "link": name, **r})
    if label == "venv":   # 4 ranks on the 2 cores: every hand-off waits for a descheduled peer
        for r in ar.spawn_ranks(sys.executable, "ringflow-inplace", 4, SIZES, {}):
            recs.append({"kind": "link", "python": label, "link": "shm4", **r})
    if hosts is not None:
        import allreduce_hosts as ah

        for r in ah.spawn(hosts, [0, 1], "ringflow", SIZES):
            recs.append({"kind": "link", "python": label, "link": "net", **r})
    return recs


def run_layout(shape: str, name: str, hosts) -> dict:
    _, nhosts, per_host, stage, link = next(x for x in LAYOUTS if x[0] == name)
    if nhosts == 1:
        row = {0: "ringflow-1p"}.get(per_host - 1) or f"bench-{name}"
        tp.ROWS[row] = ("ringflow", per_host, 1, "tcp" if link == "tcp" else "auto", stage)
        rec = tp.run_row(row, shape, None)
    else:
        rec = _run_on_hosts(hosts, shape, [h for h in range(nhosts) for _ in range(per_host)],
                            stage)
    return {"kind": "step", "shape": shape, "layout": name,
            "step_ms": statistics.median(rec["step_ms"]), "update_ms": rec.get("update_ms"),
            "comm_ms": rec.get("comm_ms"), "foreign": rec.get("foreign", 0.0)}


def _run_on_hosts(hosts, shape: str, placement: list[int], stage: int) -> dict:
    """train_parallel.py's ringflow worker on the namespace hosts (their python3)."""
    import secrets

    n = len(placement)
    local = [placement[:r].count(h) for r, h in enumerate(placement)]
    eps = [f"{hosts[h].address}:{29500 + i}" for h, i in zip(placement, local)]
    job = (f"scale{secrets.token_hex(3)}", secrets.token_hex(16))
    procs = []
    try:
        for rank, (h, i) in enumerate(zip(placement, local)):
            env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
                   "PYTHONPATH": host_pythonpath(), "PYTHONUNBUFFERED": "1",
                   "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                   "RINGFLOW_NUM_THREADS": "1", "OPENBLAS_THREAD_TIMEOUT": "18",
                   "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(n),
                   "PADDLE_TRAINER_ENDPOINTS": ",".join(eps), "PADDLE_TRAINING_ROLE": "TRAINER",
                   "PADDLE_CURRENT_ENDPOINT": eps[rank], "PADDLE_RANK_IN_NODE": str(i),
                   "PADDLE_LOCAL_SIZE": str(placement.count(h)), "RINGFLOW_JOB_ID": job[0],
                   "RINGFLOW_JOB_TOKEN": job[1], "BENCH_MP": "1", "BENCH_SHARDING": str(stage)}
            procs.append(subprocess.Popen(
                ["nsenter", f"--target={hosts[h].init_pid}", "--net", "--pid", "--mount",
                 "--ipc", "--uts", "--", HOST_PY, str(HERE / "train_parallel.py"), "--worker",
                 "ringflow", "--shape", shape], env=env, cwd="/", text=True,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                start_new_session=True))
        out, _ = procs[0].communicate(timeout=1800)
        for p in procs[1:]:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return json.loads(out.split("BENCH ", 1)[1].splitlines()[0])


def measure(shapes: list[str], rounds: int) -> None:
    from tests.hosts import NsHosts

    records: list[dict] = []

    def save(new: list[dict]) -> None:
        records.extend(new)
        OUT.write_text("".join(json.dumps(r) + "\n" for r in records))

    with NsHosts(2) as hosts:
        for rnd in range(rounds):   # calibrated in every round, as the layouts are measured
            save([{**r, "round": rnd} for r in calibrate(sys.executable, "venv", shapes)
                  + calibrate(HOST_PY, "host", shapes, hosts)])
            for shape in shapes:
                for name, _, per_host, _, _ in LAYOUTS:
                    if per_host * (2 if "+" in name else 1) == 4 and shape not in FOUR_RANKS_ONLY:
                        continue
                    tp.ts.wait_quiet(10.0)
                    rec = run_layout(shape, name, hosts)
                    rec["round"] = rnd
                    save([rec])
                    print(f"round {rnd} {shape} {name:16s} {rec['step_ms']:8.1f} ms", flush=True)


# ------------------------------------------------------------------------------ reporting
def calibrations(records: list[dict]) -> dict[tuple[str, str], sm.Calibration]:
    """(shape, interpreter) -> the model's calibration."""
    links = {}
    for name, handoffs, factor in (("shm", 3, 1.0), ("tcp", 2, 1.0), ("net", 2, 1.0),
                                   ("shm4", 3, 1.5)):
        pts = [(r["size"], r["time_us"] * 1e-6) for r in records
               if r["kind"] == "link" and r["link"] == name]
        if pts:
            links[name] = sm.fit_link(pts, handoffs, factor)
    cals = {}
    for r in (r for r in records if r["kind"] == "fb"):
        key = (r["shape"], r["python"])
        mine = [x for x in records if x["kind"] == "fb" and (x["shape"], x["python"]) == key]
        points: dict[tuple, list[dict]] = {}
        for x in mine:
            points.setdefault((x["batch"], x["threads"], x["copies"]), []).append(x)
        fbs = {k: statistics.median(x["fb_ms"] for x in v) for k, v in points.items()}
        full = max(fbs)[0]
        upd = statistics.median(x["update_ms"] for x in points[(full, 2, 1)])
        cals[key] = sm.Calibration(r["shape"], r["params"], full, fbs,
                                   upd * 1e6 / r["params"], links, sizes=param_sizes(r["shape"]))
    return cals


def param_sizes(shape: str) -> tuple[int, ...]:
    """The MLP's parameter sizes in the order its gradients are reduced (the last layer
    first, each layer's bias before its weight): what sharding cuts."""
    hidden = tp.SHAPES[shape][0]
    dims = [tp.ts.DIN] + [hidden] * tp.ts.NLAYERS + [tp.ts.NCLS]
    sizes: list[int] = []
    for a, b in reversed(list(itertools.pairwise(dims))):
        sizes += [b, a * b]
    return tuple(sizes)


def validation(records: list[dict]) -> str:
    cals = calibrations(records)
    steps: dict[tuple, list[float]] = {}
    for r in records:
        if r["kind"] == "step":
            steps.setdefault((r["shape"], r["layout"]), []).append(r["step_ms"])
    lines = ["| shape | layout | measured ms | predicted ms | compute / update / comm ms | "
             "error |", "|---|---|---:|---:|---|---:|"]
    for (shape, name), got in steps.items():
        _, hosts, per_host, stage, link = next(x for x in LAYOUTS if x[0] == name)
        cal = cals[(shape, "host" if hosts > 1 else "venv")]
        parts = sm.step_parts(cal, sm.Layout(hosts, per_host, stage, link))
        want, meas = 1e3 * sum(parts.values()), statistics.median(got)
        split = " / ".join(f"{1e3 * v:.0f}" for v in parts.values())
        lines.append(f"| {shape} | {name} | {meas:.1f} | {want:.1f} | {split} | "
                     f"{(want - meas) / meas:+.0%} |")
    return "\n".join(lines) + "\n"


PROJECT_HOSTS, PROJECT_GBIT = (8, 16, 32, 64), (10, 25, 100)


def projection(records: list[dict]) -> tuple[str, list[dict]]:
    cals = calibrations(records)
    rows = []
    lines = ["| shape | hosts x 8 | Gb/s | plain dp: step ms (eff.) | sharded: step ms (eff.) | "
             "sharded comm ms: as built (whole parameters) / even parts (not built) |",
             "|---|---:|---:|---:|---:|---:|"]
    for (shape, py), cal in sorted(cals.items()):
        if py != "venv":
            continue
        for gbit in PROJECT_GBIT:
            for hosts in PROJECT_HOSTS:
                plain = sm.project(cal, hosts, 8, gbit, 0)
                shard = sm.project(cal, hosts, 8, gbit, 1)
                rows.append({"shape": shape, "hosts": hosts, "gbit": gbit, "plain": plain,
                             "sharded": shard})
                lines.append(f"| {shape} | {hosts} x 8 | {gbit} | {plain['step_ms']:.0f} "
                             f"({plain['efficiency']:.2f}) | {shard['step_ms']:.0f} "
                             f"({shard['efficiency']:.2f}) | {shard['comm_ms']:.0f} / "
                             f"{shard['two_level_comm_ms']:.0f} |")
    return "\n".join(lines) + "\n", rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for gbit in PROJECT_GBIT:
            mine = [r for r in rows if r["shape"] == shape and r["gbit"] == gbit]
            ranks = [8 * r["hosts"] for r in mine]
            ax.plot(ranks, [r["plain"]["efficiency"] for r in mine], "o--",
                    label=f"plain dp, {gbit} Gb/s")
            ax.plot(ranks, [r["sharded"]["efficiency"] for r in mine], "s-",
                    label=f"sharded, {gbit} Gb/s")
            ax.plot(ranks, [r["sharded"]["two_level_efficiency"] for r in mine], "^:",
                    label=f"sharded, even parts (not built), {gbit} Gb/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (hosts x 8)")
        ax.set_ylabel("weak-scaling efficiency (model)")
        ax.set_title(f"shape {shape}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("measure", "report"))
    ap.add_argument("jsonl", nargs="?", default=str(OUT))
    ap.add_argument("--shapes", default="A,B")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.what == "measure":
        measure(args.shapes.split(","), args.rounds)
    records = [json.loads(x) for x in Path(args.jsonl).read_text().splitlines() if x]
    print(validation(records))
    text, rows = projection(records)
    print(text)
    plot(rows, HERE / "scaling.png")


if __name__ == "__main__":
    main()
