"""The end of `make demo`: the newest run of a DAG in the demo's Airflow home, read through
Airflow's public REST API (/api/v2): its state, the training task's summary (its XCom) and
the event it emitted on its Asset; then, if named, the newest run of the evaluate DAG: the
model's validation loss and the text it wrote.

`make demo` runs the DAG with `airflow dags test`, which leaves no server behind, so this
starts `airflow api-server` on a free loopback port for the reads (about 15 s) and stops it
again. The server lets every caller in as admin (`simple_auth_manager_all_admins`): it
listens on 127.0.0.1 only and lives only as long as this script.

    AIRFLOW_HOME=.airflow python scripts/demo_summary.py [dag_id] [task_id]
        [evaluate_dag_id evaluate_task_id]
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

START_TIMEOUT_S = 150.0  # about 15 s on an idle 2-core machine
STOP_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def api_server() -> Any:
    """An `airflow api-server` on this Airflow home, as an httpx client of /api/v2."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__API__BASE_URL": base,
           "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                          "simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
    airflow = Path(sys.executable).parent / "airflow"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([str(airflow), "api-server", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", "1"], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with httpx.Client(base_url=f"{base}/api/v2", timeout=30) as client:
                _wait_up(client, proc, log)
                yield client
        finally:
            _stop(proc)


def _wait_up(client: httpx.Client, proc: subprocess.Popen, log: Any) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(httpx.HTTPError):
            if client.get("/monitor/health", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    log.seek(0)
    tail = log.read().decode(errors="replace").splitlines()[-30:]
    raise RuntimeError("airflow api-server did not answer (exit code "
                       f"{proc.poll()}):\n" + "\n".join(tail))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL if it outlives STOP_TIMEOUT_S."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _get(client: httpx.Client, path: str, **query: Any) -> Any:
    response = client.get(path, params=query)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.json()


def read_run(client: httpx.Client, dag_id: str, task_id: str) -> dict[str, Any] | None:
    """The newest run of `dag_id`: its id and state, the task's XCom, its Asset event."""
    runs = _get(client, f"/dags/{dag_id}/dagRuns", order_by="-id", limit=1)
    if not runs or not runs["dag_runs"]:
        return None
    run = runs["dag_runs"][0]
    run_id = run["dag_run_id"]
    xcom = _get(client, f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                        f"{task_id}/xcomEntries/return_value")
    events = _get(client, "/assets/events", source_dag_id=dag_id, source_run_id=run_id,
                  order_by="-timestamp", limit=1)
    event = (events or {}).get("asset_events") or [None]
    return {"run_id": run_id, "state": run["state"],
            "summary": xcom["value"] if xcom else None, "event": event[0]}


def show(dag_id: str, task_id: str, found: dict[str, Any]) -> int:
    summary, event, state = found["summary"], found["event"], found["state"]
    print(f"\n{dag_id} run {found['run_id']}: {state}")
    if not summary:
        print(f"(task {task_id} returned no summary)")
        return 0 if state == "success" else 1
    history = summary["loss_history"]
    if history:
        print(f"loss {history[0][1]:.4f} at step {history[0][0]} -> {summary['final_loss']:.4f} "
              f"at step {summary['steps']}  ({summary['world_size']} ranks: mp "
              f"{summary['mp_degree']} x dp {summary['dp_degree']}, "
              f"{summary['samples_per_s']:,.0f} samples/s)")
    print(f"checkpoint  {summary['checkpoint']}")
    print(f"worker logs {summary['log_dir']}")
    print(f"loss plot   {summary['plot'] or '(none: see the task log)'}")
    if summary.get("loss_history_file"):
        print(f"losses      {summary['loss_history_file']}")
    if event is not None:
        print(f"asset event {event.get('uri')} {event.get('extra')}")
    return 0 if state == "success" else 1


def read_task(client: httpx.Client, dag_id: str, task_id: str) -> dict[str, Any] | None:
    """The newest run of `dag_id`: its id and state, the task's state and XCom."""
    runs = _get(client, f"/dags/{dag_id}/dagRuns", order_by="-id", limit=1)
    if not runs or not runs["dag_runs"]:
        return None
    run = runs["dag_runs"][0]
    path = (f"/dags/{dag_id}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances/"
            f"{task_id}")
    ti = _get(client, path)
    xcom = _get(client, f"{path}/xcomEntries/return_value")
    return {"run_id": run["dag_run_id"], "state": run["state"],
            "task_state": ti["state"] if ti else None, "value": xcom["value"] if xcom else None}


def show_evaluation(dag_id: str, task_id: str, found: dict[str, Any] | None) -> int:
    if found is None:
        print(f"\nno run of {dag_id}")
        return 1
    print(f"\n{dag_id} run {found['run_id']}: {found['state']} (task {task_id}: "
          f"{found['task_state']})")
    result = found["value"]
    if not result:
        print(f"(no result: the task {found['task_state'] or 'did not run'}; its log says why"
              f", e.g. a model that misses the gate or one trained without validation data)")
        return 0 if found["state"] == "success" else 1
    metrics = ", ".join(f"{k} {result[k]:.4f}" for k in ("val_loss", "perplexity", "accuracy")
                        if k in result)
    print(f"model       {result['checkpoint']} (step {result['step']}): {metrics} on "
          f"{result['samples']} validation samples")
    if "generated" in result:
        print(f"generated (prompt {result['prompt']!r}):")
        print(result["prompt"] + result["generated"])
    return 0 if found["state"] == "success" else 1


def main(argv: list[str]) -> int:
    dag_id = argv[0] if argv else "ringflow_tp_train"
    task_id = argv[1] if len(argv) > 1 else "train"
    with api_server() as client:
        found = read_run(client, dag_id, task_id)
        evaluated = read_task(client, argv[2], argv[3]) if len(argv) > 3 else None
    if found is None:
        print(f"no run of {dag_id} in this Airflow home", file=sys.stderr)
        return 1
    code = show(dag_id, task_id, found)
    if len(argv) > 3:
        code = show_evaluation(argv[2], argv[3], evaluated) or code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
