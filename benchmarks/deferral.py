"""Jobs that outlive the task (not a test): what deferring saves and what the watch costs,
through real Airflow services (api-server, scheduler with the LocalExecutor, dag-processor,
triggerer; SQLite), tests/airflow_services.py.

1. Worker-slot seconds of a training job of about `--minutes`: the example DAG
   `ringflow_tp_train` once attached and once deferrable, one after the other; the task
   instance's state is read every 0.5 s and the time it is `running` (a worker slot held)
   and `deferred` is summed.
2. One triggerer watching `--jobs` deferred jobs at `poll_interval` 10 s: mapped
   PopRunOperator tasks (deferrable) whose command is a ticker printing `tick <n> <host
   time>` every second, under ringflow's supervisor on two namespace hosts (tests/hosts.py).
   Over `--window` seconds with every task deferred: the triggerer's CPU (utime + stime of
   its processes, from /proc) and memory (their RSS) against the same window before any job,
   and each line's delay from the time printed in it to the triggerer's log record of it.

    .venv/bin/python benchmarks/deferral.py [--minutes 5] [--jobs 50] [--readme]

Needs root (the namespace hosts). Writes benchmarks/deferral.jsonl; --readme writes the
table into the docs (docs/guides/deferrable.md). Goals: deferrable <= 10 worker-slot seconds;
per job <= 0.5 % of a core and a line delay p95 <= 2 x poll_interval.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests import airflow_env  # noqa: E402  (first: it sets AIRFLOW_HOME)

DAGS = Path(tempfile.mkdtemp(prefix="ringflow-bench-dags-"))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
os.environ["AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG"] = "256"

from tests.airflow_services import AirflowServices  # noqa: E402
from tests.hosts import NsHosts  # noqa: E402

OUT = HERE / "deferral.jsonl"
POLL_S = 10
TICKER = "/root/ringflow-ticker"
TICKER_SH = """#!/bin/sh
# prints a line a second with this host's clock, for as long as asked ($RINGFLOW_TICKS)
i=0
while [ "$i" -lt "${RINGFLOW_TICKS:-600}" ]; do
  echo "tick $i $(date +%s.%N)"
  i=$((i + 1))
  sleep 1
done
"""
TICKER_DAG = '''
from airflow.sdk import DAG
from ringflow_provider.operators.poprun import PopRunOperator

with DAG("ringflow_bench_ticker", schedule=None, max_active_tasks=256) as dag:
    PopRunOperator.partial(
        task_id="tick", nproc_per_host=1, ipus_per_replica=1, num_ipus=1,
        ipu_partition="bench", vipu_server="127.0.0.1", training_script="unused.py",
        poprun="{ticker}", python="/usr/bin/python3", preflight=False,
        extra_env={{"RINGFLOW_TICKS": "{ticks}"}}, deferrable=True,
        poll_interval={poll}, retries=0,
    ).expand_kwargs({targets!r})
'''


# -- 1. worker-slot seconds -------------------------------------------------------------------
def slot_seconds(api, conf: dict) -> dict:
    """Trigger the TP DAG with `conf`; seconds its task was running and deferred."""
    api.unpause("ringflow_tp_train")
    before = api.run_ids("ringflow_tp_train")
    response = api.trigger("ringflow_tp_train", api.form_conf("ringflow_tp_train", **conf))
    assert response.status_code == 200, response.text
    run = api.wait_for_new_run("ringflow_tp_train", before)
    spent = {"running": 0.0, "deferred": 0.0}
    last, state = time.monotonic(), None
    while state not in ("success", "failed"):
        ti = api.task_instance("ringflow_tp_train", run, "train")
        now = time.monotonic()
        if state in spent:
            spent[state] += now - last
        last, state = now, ti["state"]
        time.sleep(0.5)
    assert state == "success", api.task_logs("ringflow_tp_train", run)
    summary = api.xcom("ringflow_tp_train", run, "train")
    return {"worker_slot_s": round(spent["running"], 1),
            "deferred_s": round(spent["deferred"], 1),
            "samples_per_s": summary["samples_per_s"], "steps": summary["steps"]}


# -- 2. one triggerer, many jobs --------------------------------------------------------------
def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def usage(pids: list[int]) -> tuple[float, int]:
    """(CPU seconds so far, RSS bytes) of the processes."""
    ticks, rss = 0, 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf(
                "SC_PAGE_SIZE")
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK"), rss


def measure(root: int, window: float) -> dict:
    pids = process_tree(root)
    cpu0, _ = usage(pids)
    rss = []
    started = time.monotonic()
    while time.monotonic() - started < window:
        rss.append(usage(process_tree(root))[1])
        time.sleep(2)
    cpu1, _ = usage(process_tree(root))
    return {"cpu_core_pct": round(100 * (cpu1 - cpu0) / window, 3),
            "rss_mib": round(statistics.median(rss) / 2**20, 1)}


_TICK = re.compile(r"^tick (\d+) (\d+\.\d+)$")


def line_delays(log_root: Path, since: float) -> list[float]:
    """Seconds from the host time in each tick line to the trigger's log record of it."""
    delays = []
    for path in log_root.rglob("*.trigger.*.log"):
        if "ringflow_bench_ticker" not in str(path):
            continue
        for raw in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            found = _TICK.match(str(record.get("event", "")))
            if not found or float(found.group(2)) < since:
                continue
            logged = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
            delays.append(logged.timestamp() - float(found.group(2)))
    return delays


def ticker_dag(hosts, jobs: int, window: float) -> str:
    """The benchmark DAG: `jobs` mapped tickers over the hosts (known when it is written)."""
    targets = [{"hosts": hosts[i % len(hosts)].address,
                "ssh_conn_id": f"bench_host_{i % len(hosts)}"} for i in range(jobs)]
    return TICKER_DAG.format(ticker=TICKER, ticks=int(window * 3 + 600), poll=POLL_S,
                             targets=targets)


def many_jobs(services, hosts, jobs: int, window: float) -> dict:
    api = services.api
    for i, host in enumerate(hosts):
        host.run(["sh", "-c", f"cat > {TICKER} && chmod 755 {TICKER}"], input=TICKER_SH)
        api.add_connection(f"bench_host_{i}", json.loads(host.connection_json()))
    triggerer = services.procs["triggerer"].pid
    idle = measure(triggerer, window)
    api.unpause("ringflow_bench_ticker")
    before = api.run_ids("ringflow_bench_ticker")
    response = api.trigger("ringflow_bench_ticker", {})
    assert response.status_code == 200, response.text
    run = api.wait_for_new_run("ringflow_bench_ticker", before)
    deadline = time.monotonic() + 900
    while True:
        states = [ti["state"] for ti in api.task_instances("ringflow_bench_ticker", run)]
        if states.count("deferred") == jobs:
            break
        assert time.monotonic() < deadline and "failed" not in states, states
        time.sleep(2)
    time.sleep(2 * POLL_S)  # every trigger past its first looks
    since = time.time()
    busy = measure(triggerer, window)
    delays = line_delays(services.log_dir / "logs", since)
    # marks every mapped instance at once (their jobs stop through the trigger's on_kill)
    api.set_task_state("ringflow_bench_ticker", run, "tick", "failed")
    per_job_cpu = (busy["cpu_core_pct"] - idle["cpu_core_pct"]) / jobs
    per_job_mib = (busy["rss_mib"] - idle["rss_mib"]) / jobs
    return {"jobs": jobs, "poll_interval_s": POLL_S, "window_s": window,
            "idle": idle, "busy": busy, "cpu_pct_per_job": round(per_job_cpu, 3),
            "mib_per_job": round(per_job_mib, 2), "lines": len(delays),
            "delay_p50_s": round(statistics.median(delays), 2) if delays else None,
            "delay_p95_s": round(statistics.quantiles(delays, n=20)[18], 2)
            if len(delays) >= 20 else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--steps-per-s", type=float, default=20.0,
                        help="the TP DAG's default job on a quiet machine (to size --minutes)")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--parts", default="slots,triggerer",
                        help="which to measure; the table takes a part not measured now "
                             "from the newest record of it in deferral.jsonl")
    parser.add_argument("--readme", action="store_true")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    shutil.copy(REPO / "dags" / "ringflow_tp_train.py", DAGS)
    airflow_env.migrate()
    log_dir = Path(tempfile.mkdtemp(prefix="ringflow-bench-services-"))
    services = AirflowServices(airflow_env.AIRFLOW_HOME, log_dir)
    hosts = NsHosts(2)
    records = []
    try:
        hosts.start()
        (DAGS / "ringflow_bench_ticker.py").write_text(ticker_dag(list(hosts), args.jobs,
                                                                  args.window))
        services.start()
        steps = int(args.minutes * 60 * args.steps_per_s)
        for mode in ("attached", "deferrable") if "slots" in parts else ():
            conf = {"steps": steps, "log_every": 100, "deferrable": mode == "deferrable"}
            result = {"bench": "worker_slot", "mode": mode, **slot_seconds(services.api, conf)}
            print(json.dumps(result), flush=True)
            records.append(result)
        if "triggerer" in parts:
            result = {"bench": "triggerer", **many_jobs(services, list(hosts), args.jobs,
                                                        args.window)}
            print(json.dumps(result), flush=True)
            records.append(result)
    finally:
        services.stop()
        hosts.close()
    stamp = {"date": time.strftime("%Y-%m-%d %H:%M"), "loadavg": os.getloadavg()[0]}
    with open(OUT, "a") as f:
        for record in records:
            f.write(json.dumps({**stamp, **record}) + "\n")
    table = readme_table(records + earlier(records))
    print(table)
    if args.readme:
        write_readme(table)
    return 0


def earlier(records: list[dict]) -> list[dict]:
    """The newest recorded result of each part this run did not measure."""
    measured = {(r["bench"], r.get("mode")) for r in records}
    newest: dict[tuple, dict] = {}
    if OUT.exists():
        for line in OUT.read_text().splitlines():
            record = json.loads(line)
            newest[(record["bench"], record.get("mode"))] = record
    return [r for key, r in newest.items() if key not in measured]


def readme_table(records: list[dict]) -> str:
    slots = {r["mode"]: r for r in records if r["bench"] == "worker_slot"}
    trig = next(r for r in records if r["bench"] == "triggerer")
    rows = ["| job of the TP DAG | worker-slot seconds | deferred seconds | goal | met |",
            "|---|---:|---:|---|:---:|"]
    for mode, r in slots.items():
        goal = "<= 10 s" if mode == "deferrable" else "-"
        met = ("yes" if r["worker_slot_s"] <= 10 else "no") if mode == "deferrable" else "-"
        rows.append(f"| {mode}, {r['steps']} steps | {r['worker_slot_s']:.1f} | "
                    f"{r['deferred_s']:.1f} | {goal} | {met} |")
    rows += ["", f"| one triggerer, {trig['jobs']} deferred jobs, poll {trig['poll_interval_s']}"
             " s | measured | goal | met |", "|---|---:|---|:---:|",
             f"| CPU per job (% of a core) | {trig['cpu_pct_per_job']:.3f} | <= 0.5 | "
             f"{'yes' if trig['cpu_pct_per_job'] <= 0.5 else 'no'} |",
             f"| memory per job (MiB) | {trig['mib_per_job']:.2f} | - | - |",
             f"| line delay p50 (s) | {trig['delay_p50_s']} | - | - |",
             f"| line delay p95 (s) | {trig['delay_p95_s']} | <= {2 * POLL_S} | "
             f"{'yes' if (trig['delay_p95_s'] or 1e9) <= 2 * POLL_S else 'no'} |",
             f"| triggerer idle / with the jobs: CPU % of a core | "
             f"{trig['idle']['cpu_core_pct']:.2f} / {trig['busy']['cpu_core_pct']:.2f} | - | - |"]
    return "\n".join(rows)


def write_readme(table: str) -> None:
    readme = REPO / "docs" / "guides" / "deferrable.md"
    text = readme.read_text()
    start, end = "<!-- table: deferral -->", "<!-- end table: deferral -->"
    if start not in text:
        raise SystemExit(f"{readme} has no {start} ... {end} section")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{table}\n{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
