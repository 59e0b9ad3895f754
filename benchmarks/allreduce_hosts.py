"""All-reduce between two hosts (not a test; issue 11): ringflow's ring all-reduce between two
namespace hosts (tests/hosts.py: own network namespace, address on one bridge, their link a
veth pair each) with 1 and 2 ranks per host (2 per host: in two levels, the default, and in one
flat ring, RINGFLOW_TWO_LEVEL=0), beside the limit measured between the same two
hosts in the same run: a raw two-way socket stream of the same size (allreduce_workers.py's
`tcpstream`, the README's method), interleaved in rounds. Needs root (the hosts).

    .venv/bin/python benchmarks/allreduce_hosts.py [--rounds 3] [--readme]

The ranks run on the hosts' own interpreter (Debian's /usr/bin/python3 + numpy), with the
checkout's runtime on PYTHONPATH (the hosts share /usr and this folder, not /tmp or home).
Writes benchmarks/allreduce-hosts.jsonl; prints the table and the goal (busbw >= 85 % of the
stream), which --readme writes into the benchmarks page of the docs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from tests.hosts import HOST_PATH, NsHosts  # noqa: E402

from allreduce import WORKER, size_label, summarize  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
SIZES = [64 * KiB, MiB, 16 * MiB, 64 * MiB]
GOAL = 0.85
PORT = 29400
OUT = HERE / "allreduce-hosts.jsonl"


def spawn(hosts, placement: list[int], backend: str, sizes: list[int],
          extra: dict[str, str] | None = None) -> list[dict]:
    """One worker per entry of `placement` (the host index of each rank, host-major), each
    inside its host's namespaces; returns rank 0's JSON records."""
    n = len(placement)
    local = [placement[:r].count(h) for r, h in enumerate(placement)]
    eps = [f"{hosts[h].address}:{PORT + i}" for h, i in zip(placement, local)]
    job = (f"bench{secrets.token_hex(3)}", secrets.token_hex(16))
    procs = []
    try:
        for rank, (h, i) in enumerate(zip(placement, local)):
            env = {"PATH": HOST_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                   "PYTHONPATH": str(REPO / "provider"), "PYTHONUNBUFFERED": "1",
                   "OMP_NUM_THREADS": "1", "PADDLE_TRAINER_ID": str(rank),
                   "PADDLE_TRAINERS_NUM": str(n), "PADDLE_TRAINER_ENDPOINTS": ",".join(eps),
                   "PADDLE_CURRENT_ENDPOINT": eps[rank], "PADDLE_RANK_IN_NODE": str(i),
                   "PADDLE_LOCAL_SIZE": str(placement.count(h)), "RINGFLOW_JOB_ID": job[0],
                   "RINGFLOW_JOB_TOKEN": job[1],
                   "BENCH_MASTER": f"{hosts[0].address}:{PORT + 100}", **(extra or {})}
            procs.append(subprocess.Popen(
                ["nsenter", f"--target={hosts[h].init_pid}", "--net", "--pid", "--mount",
                 "--ipc", "--uts", "--", "/usr/bin/python3", str(WORKER), backend,
                 ",".join(map(str, sizes))], env=env, cwd="/",
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


def one_round(hosts, sizes: list[int]) -> list[dict]:
    recs = [{**r, "backend": "tcpstream", "placement": "1+1"}
            for r in spawn(hosts, [0, 1], "tcpstream", sizes)]
    for placement, extra, suffix in (([0, 1], {}, ""), ([0, 0, 1, 1], {}, ""),
                                     ([0, 0, 1, 1], {"RINGFLOW_TWO_LEVEL": "0"}, "-flat")):
        label = "+".join(str(placement.count(h)) for h in (0, 1))
        recs += [{**r, "backend": f"ringflow-{label}{suffix}", "placement": label}
                 for r in spawn(hosts, placement, "ringflow", sizes, extra)]
    return recs


# backend -> (what the table calls it)
BACKENDS = {"tcpstream": "two-way stream", "ringflow-1+1": "ringflow",
            "ringflow-2+2": "ringflow, two levels", "ringflow-2+2-flat": "ringflow, one flat ring"}


def table(summary: dict, sizes: list[int]) -> str:
    lines = ["| between 2 hosts | ranks | size | time (us) | busbw GB/s | busbw min..max | "
             "vs stream |", "|---|---:|---:|---:|---:|---:|---:|"]
    for backend in BACKENDS:
        for size in sizes:
            s, ref = summary.get((backend, size)), summary.get(("tcpstream", size))
            if s is None:
                continue
            ratio = "" if backend == "tcpstream" or not ref else f"{s['busbw'] / ref['busbw']:.2f}"
            flag = "" if s["correct"] else " (WRONG RESULT)"
            name = BACKENDS[backend] + flag
            lines.append(f"| {name} | {s['n']} | {size_label(size)} | {s['time_us']:.1f} | "
                         f"{s['busbw']:.3f} | {s['min']:.2f}..{s['max']:.2f} | {ratio} |")
    return "\n".join(lines)


def goal_lines(summary: dict) -> str:
    lines = [f"| goal: busbw >= {GOAL:.0%} of the stream, 64 MiB | measured | met |",
             "|---|---:|:---:|"]
    ref = summary.get(("tcpstream", 64 * MiB))
    for backend in ("ringflow-1+1", "ringflow-2+2"):
        s = summary.get((backend, 64 * MiB))
        if s and ref:
            ratio = s["busbw"] / ref["busbw"]
            lines.append(f"| {s['n']} ranks ({backend.split('-')[1]}, {BACKENDS[backend]}) | "
                         f"{ratio:.0%} | "
                         f"{'yes' if ratio >= GOAL else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--report", type=Path, help="only summarize this .jsonl file")
    ap.add_argument("--readme", action="store_true",
                    help="write the tables into docs/benchmarks/index.md")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.report:
        records = [json.loads(x) for x in args.report.read_text().splitlines() if x.strip()]
    else:
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        records = []
        with NsHosts(2) as hosts:
            for rnd in range(args.rounds):
                for rec in one_round(hosts, sizes):
                    rec["round"] = rnd
                    records.append(rec)
                    print(f"round {rnd} {rec['backend']:>17} {size_label(rec['size']):>7} "
                          f"{rec['time_us']:10.1f} us  busbw {rec['busbw']:7.3f} GB/s",
                          flush=True)
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        OUT.write_text("".join(json.dumps({**r, "loadavg_before": load_before,
                                           "loadavg_after": load_after}) + "\n"
                               for r in records))
    summary = summarize(records)
    text = table(summary, sizes) + "\n\n" + goal_lines(summary)
    print(text)
    if args.readme:
        readme = REPO / "docs" / "benchmarks" / "index.md"
        body = readme.read_text()
        begin, end = "<!-- table: allreduce-hosts -->", "<!-- end table: allreduce-hosts -->"
        body, count = re.subn(rf"{re.escape(begin)}.*?{re.escape(end)}",
                              f"{begin}\n{text}\n{end}", body, flags=re.S)
        if count != 1:
            sys.exit(f"{readme} has no allreduce-hosts table markers")
        readme.write_text(body)


if __name__ == "__main__":
    main()
