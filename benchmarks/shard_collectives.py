"""The sharded step's collectives (issue 19): reduce_scatter_v and all_gather_v against the
all-reduce of the same buffer, ringflow over shared memory (staged through the slots, and
in place on comm.shared_array buffers) and over TCP, in rounds, in one run. Goal: each
half's bus bandwidth within 10 % of the all-reduce's at 16-256 MiB (busbw as nccl-tests:
all-reduce algbw * 2(n-1)/n, reduce-scatter and all-gather algbw * (n-1)/n).

    .venv/bin/python benchmarks/shard_collectives.py [--nprocs 2] [--rounds 3]
    .venv/bin/python benchmarks/shard_collectives.py --hosts [--rounds 3]   (as root)

--hosts runs them between two namespace hosts (allreduce_hosts.py's, on the hosts' own
python3 + numpy): 1 rank per host, 2 per host in two levels (the default), and 2 per host
in one flat ring (RINGFLOW_TWO_LEVEL=0).

Timing is allreduce_workers.py's: per size 3 warm-up ops, then 9 batches of k back-to-back
ops after a barrier, the slowest rank's batch time / k, the median over batches; the table
gives the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import allreduce as ar  # noqa: E402  (spawn_ranks, the env contract)

SIZES = [ar.MiB, 16 * ar.MiB, 64 * ar.MiB, 256 * ar.MiB]
OPS = ("all_reduce", "reduce_scatter", "all_gather")


def one_round(n: int, sizes: list[int]) -> list[dict]:
    recs = ar.spawn_ranks(sys.executable, "ringflow-shard", n, sizes, {})
    return recs + ar.spawn_ranks(sys.executable, "ringflow-shard", n, sizes,
                                 {"RINGFLOW_TRANSPORT": "tcp"})


# between two hosts: (placement, env, what the table calls it)
HOST_LAYOUTS = [([0, 1], {}, "1+1, ring"), ([0, 0, 1, 1], {}, "2+2, two levels"),
                ([0, 0, 1, 1], {"RINGFLOW_TWO_LEVEL": "0"}, "2+2, one flat ring")]
HOST_SIZES = [ar.MiB, 16 * ar.MiB, 64 * ar.MiB, 256 * ar.MiB]


def hosts_round(hosts, sizes: list[int]) -> list[dict]:
    import allreduce_hosts

    recs = []
    for placement, extra, label in HOST_LAYOUTS:
        recs += [{**r, "backend": label}
                 for r in allreduce_hosts.spawn(hosts, placement, "ringflow-shard", sizes, extra)]
    return recs


def table(records: list[dict], n: int) -> str:
    cells: dict[tuple, list[float]] = {}
    for r in records:
        cells.setdefault((r["backend"], r["size"], r["op"]), []).append(r["busbw"])
    lines = [f"| {n} | size | all-reduce busbw GB/s | reduce-scatter GB/s (vs AR) | "
             "all-gather GB/s (vs AR) |", "|---|---|---:|---:|---:|"]
    for backend in sorted({k[0] for k in cells}):
        for size in sorted({k[1] for k in cells if k[0] == backend}):
            bw = {op: statistics.median(cells[(backend, size, op)]) for op in OPS}
            ar_bw = bw["all_reduce"]
            lines.append(f"| {backend} | {ar.size_label(size)} | {ar_bw:.2f} | "
                         f"{bw['reduce_scatter']:.2f} ({bw['reduce_scatter'] / ar_bw:.2f}x) | "
                         f"{bw['all_gather']:.2f} ({bw['all_gather'] / ar_bw:.2f}x) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--hosts", action="store_true",
                    help="between two namespace hosts (as root), 1+1 and 2+2 ranks")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", default=None, help="only summarize this .jsonl")
    args = ap.parse_args()
    if args.report:
        records = [json.loads(x) for x in Path(args.report).read_text().splitlines() if x]
        print(table(records, "between 2 hosts" if "hosts" in args.report
                    else f"{records[0]['n']} ranks"))
        return
    if args.hosts:
        main_hosts(args)
        return
    out = Path(args.out or HERE / f"shard_collectives-n{args.nprocs}.jsonl")
    records = []
    for r in range(args.rounds):
        for rec in one_round(args.nprocs, SIZES):
            rec["round"] = r
            records.append(rec)
        out.write_text("".join(json.dumps(x) + "\n" for x in records))
        print(f"round {r} done", flush=True)
    print(table(records, f"{args.nprocs} ranks"))


def main_hosts(args) -> None:
    sys.path.insert(0, str(HERE.parent))
    from tests.hosts import NsHosts

    out = Path(args.out or HERE / "shard_collectives-hosts.jsonl")
    records = []
    with NsHosts(2) as hosts:
        for r in range(args.rounds):
            load = Path("/proc/loadavg").read_text().split()[:3]
            for rec in hosts_round(hosts, HOST_SIZES):
                records.append({**rec, "round": r, "loadavg_before": load})
            out.write_text("".join(json.dumps(x) + "\n" for x in records))
            print(f"round {r} done", flush=True)
    print(table(records, "between 2 hosts"))


if __name__ == "__main__":
    main()
