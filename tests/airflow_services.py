"""Real Airflow services for the test run, and a REST client for them.

`AirflowServices` starts `airflow api-server`, `airflow scheduler` (LocalExecutor) and
`airflow dag-processor` on 127.0.0.1 with the run's Airflow home (tests/airflow_env.py:
SQLite, the repository's dags/, no examples), waits until /api/v2/monitor/health reports
them healthy, and stops them so that no process is left (checked through /proc).

Auth is Airflow's default SimpleAuthManager as `airflow standalone` sets it up: user `admin`,
whose password the api-server generates once into
`$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated`. The REST client logs in as
Airflow's API docs show (`POST /auth/token`, then a Bearer token); the browser test signs in
through the login page with the same credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests import procs
from tests.airflow_env import VENV_BIN

MARK_VAR = "RINGFLOW_AIRFLOW_SERVICES"  # inherited by every process the services start
ADMIN = "admin"  # SimpleAuthManager's default user ([core] simple_auth_manager_users)
# A second user with no role: signed in, but SimpleAuthManager grants it nothing, so it may
# not read any DAG (the access tests' user who lacks access)
OUTSIDER = "outsider"
START_TIMEOUT_S = 150.0  # about 15 s on an idle 2-core machine
STOP_TIMEOUT_S = 20.0
TERMINAL_STATES = {"success", "failed"}
SERVICES = {  # name -> `airflow` arguments
    "api-server": ("api-server", "--host", "127.0.0.1", "--workers", "1"),
    # Task logs are files the api-server reads itself: no log-serving process (and no fixed
    # port 8793 shared with whatever else runs on the machine).
    "scheduler": ("scheduler", "--skip-serve-logs"),
    "dag-processor": ("dag-processor",),
    # watches deferred tasks (the operators' deferrable mode)
    "triggerer": ("triggerer", "--skip-serve-logs"),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked_processes(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries MARK_VAR=mark."""
    return procs.marked_processes(MARK_VAR, mark)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


_LOG_CONTEXT = {"timestamp", "level", "event", "logger", "filename", "lineno", "ti_id",
                "map_index", "try_number", "task_id", "run_id", "dag_id", "error_detail"}


def _log_line(entry: Any) -> str:
    """One entry of a task log as the API returns it (structured since Airflow 3), without
    the context every line repeats; an exception as its type and message."""
    if not isinstance(entry, dict):
        return str(entry)
    line = f"{entry.get('timestamp', '')} {entry.get('level', '')} {entry.get('event', '')}"
    rest = {k: v for k, v in entry.items() if k not in _LOG_CONTEXT}
    if rest:
        line += f" {rest}"
    for error in entry.get("error_detail") or []:
        line += f"\n    {error.get('exc_type')}: {error.get('exc_value')}"
    return line


class AirflowServices:
    """api-server + scheduler + dag-processor on loopback; see the module docstring.

    `base_url` is the UI and REST root, `api` a logged-in `AirflowAPI`, `log_dir` holds one
    `<service>.log` per service and the task logs (`logs/`), `admin_password` the generated
    password of user `admin`.
    """

    def __init__(self, home: Path, log_dir: Path) -> None:
        self.home, self.log_dir = home, log_dir
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.mark = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen] = {}
        self._api: AirflowAPI | None = None

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            MARK_VAR: self.mark,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                           "simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin,{OUTSIDER}:",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.log_dir / "logs"),
            # a retry comes 2 s after a failed try (not 5 min), and a triggerer that dies is
            # replaced within seconds (its triggers move to the next one after 6 s)
            "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "6",
        }

    def start(self) -> None:
        for name in SERVICES:
            self.start_service(name)
        self._wait_healthy(START_TIMEOUT_S)

    def start_service(self, name: str) -> subprocess.Popen:
        argv = [str(VENV_BIN / "airflow"), *SERVICES[name]]
        if name == "api-server":
            argv += ["--port", str(self.port)]
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, cwd=self.log_dir, env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def kill_service(self, name: str) -> None:
        """SIGKILL a service's whole process group, as a crash or an OOM kill would end it."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        health: Any = None
        while time.monotonic() < deadline:
            dead = {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"Airflow services exited during start: {dead}\n"
                                   f"{self.log_tails()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
                parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
                if all(health.get(part, {}).get("status") == "healthy" for part in parts):
                    return
            time.sleep(0.25)
        raise RuntimeError(f"Airflow services not healthy after {timeout:.0f} s (last health: "
                           f"{health})\n{self.log_tails()}")

    @property
    def admin_password(self) -> str:
        return self.password(ADMIN)

    def password(self, user: str) -> str:
        """A user's password, as the api-server generated it."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(path.read_text())[user]

    @property
    def api(self) -> AirflowAPI:
        if self._api is None:
            self._api = AirflowAPI.login(self.base_url, ADMIN, self.admin_password)
        return self._api

    def stop(self) -> list[str]:
        """SIGTERM every service's main process and wait up to STOP_TIMEOUT_S for them to
        end (about 5 s here), then SIGTERM their process groups (what a service left, such
        as a task a test left running) and wait for the rest of that time, then SIGKILL
        whatever is left. Returns the pids (with their command lines) still alive at the
        deadline: none, when Airflow shuts down cleanly.

        The main process first, as a service manager stops one: a SIGTERM to the whole group
        at once can kill a LocalExecutor worker while it holds the task queue's lock, and the
        scheduler then waits for its other workers forever."""
        if self._api is not None:
            self._api.close()
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        stuck = [name for name, proc in self.procs.items() if proc.poll() is None]
        if stuck:  # what they wait for, for the teardown's message
            with open(self.log_dir / "stop-ps.txt", "w") as out:
                subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,wchan:32,args", "--forest"],
                               stdout=out, stderr=subprocess.STDOUT, check=False)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = max(deadline, time.monotonic() + 5)
        while marked_processes(self.mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        mains = {proc.pid for proc in self.procs.values()}
        leftovers = [f"{pid} ({cmd})" for pid in marked_processes(self.mark)
                     if not _airflow_shutdown_hang(pid, cmd := _cmdline(pid), mains)]
        if leftovers and stuck:
            leftovers.append(f"({', '.join(stuck)} did not stop on SIGTERM within "
                             f"{STOP_TIMEOUT_S:g} s; processes then: {self.log_dir}/stop-ps.txt)")
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in marked_processes(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return leftovers

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(f"--- {name}.log (last {lines} lines) ---\n"
                         f"{_tail(self.log_dir / f'{name}.log', lines)}"
                         for name in SERVICES)


class AirflowAPI:
    """The public REST API (/api/v2) as user `admin`, with the calls a trigger test needs."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url
        self.http = httpx.Client(base_url=f"{base_url}/api/v2", timeout=30,
                                 headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def login(cls, base_url: str, username: str, password: str) -> AirflowAPI:
        response = httpx.post(f"{base_url}/auth/token", timeout=30,
                              json={"username": username, "password": password})
        if response.status_code != 201:
            raise RuntimeError(f"POST /auth/token: {response.status_code} {response.text}")
        return cls(base_url, response.json()["access_token"])

    def close(self) -> None:
        self.http.close()

    def get(self, path: str) -> Any:
        response = self.http.get(path)
        if response.status_code != 200:
            raise AssertionError(f"GET {path}: {response.status_code} {response.text}")
        return response.json()

    def wait_for_dag(self, dag_id: str, timeout: float = 90.0) -> dict:
        """The DAG once the dag-processor has parsed it into the database."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.http.get(f"/dags/{dag_id}")
            if response.status_code == 200:
                return response.json()
            time.sleep(0.25)
        errors = self.get("/importErrors")
        raise AssertionError(f"DAG {dag_id!r} not parsed after {timeout:.0f} s; import "
                             f"errors: {errors}")

    def unpause(self, dag_id: str) -> None:
        """Unpause as the UI's toggle does: DAGs are paused when first parsed."""
        self.wait_for_dag(dag_id)
        response = self.http.patch(f"/dags/{dag_id}", json={"is_paused": False})
        assert response.status_code == 200, response.text
        assert response.json()["is_paused"] is False

    def params(self, dag_id: str) -> dict[str, dict]:
        """The DAG's params as the trigger form gets them: name -> {value, schema, ...}."""
        return self.get(f"/dags/{dag_id}/details")["params"]

    def form_conf(self, dag_id: str, **changes: Any) -> dict[str, Any]:
        """The conf the UI's trigger form sends: every param's value, with `changes`."""
        unknown = set(changes) - set(self.params(dag_id))
        assert not unknown, f"{dag_id} has no params {sorted(unknown)}"
        return {name: p["value"] for name, p in self.params(dag_id).items()} | changes

    def trigger(self, dag_id: str, conf: dict, logical_date: str | None = None
                ) -> httpx.Response:
        """POST /dags/{dag_id}/dagRuns with the body the UI sends (logical_date null is the
        API's 'no logical date'; the UI sends the time its form shows)."""
        body = {"conf": conf, "data_interval_end": None, "data_interval_start": None,
                "logical_date": logical_date, "partition_key": None}
        return self.http.post(f"/dags/{dag_id}/dagRuns", json=body)

    def run_ids(self, dag_id: str) -> set[str]:
        runs = self.get(f"/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"]
        return {run["dag_run_id"] for run in runs}

    def wait_for_new_run(self, dag_id: str, before: set[str], timeout: float = 20.0) -> str:
        """The id of the one run of `dag_id` that is not in `before`, once it exists."""
        deadline = time.monotonic() + timeout
        while not (new := self.run_ids(dag_id) - before) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert len(new) == 1, f"expected one new run of {dag_id}, found {sorted(new)}"
        return new.pop()

    def trigger_form(self, dag_id: str, **changes: Any) -> str:
        """Unpause `dag_id` and trigger it as the UI's form does, its params' values with
        `changes`; the new run's id."""
        self.unpause(dag_id)
        before = self.run_ids(dag_id)
        response = self.trigger(dag_id, self.form_conf(dag_id, **changes))
        assert response.status_code == 200, response.text
        return self.wait_for_new_run(dag_id, before)

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> dict:
        """The run once it is finished; fails with its task logs when it did not succeed."""
        deadline = time.monotonic() + timeout
        run = self.run(dag_id, run_id)
        while run["state"] not in TERMINAL_STATES and time.monotonic() < deadline:
            time.sleep(0.5)
            run = self.run(dag_id, run_id)
        if run["state"] != "success":
            raise AssertionError(f"run {run_id} of {dag_id} is {run['state']!r} (waited up to "
                                 f"{timeout:.0f} s)\n{self.task_logs(dag_id, run_id)}")
        return run

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        return self.get(path)["task_instances"]

    def task_logs(self, dag_id: str, run_id: str) -> str:
        """Every task's last try's log, as the UI's log view shows it."""
        parts = []
        for ti in self.task_instances(dag_id, run_id):
            head = f"--- task {ti['task_id']}: {ti['state']} (try {ti['try_number']}) ---"
            if not ti["try_number"]:
                parts.append(head)
                continue
            path = (f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                    f"{ti['task_id']}/logs/{ti['try_number']}?full_content=true")
            response = self.http.get(path)
            if response.status_code != 200:
                parts.append(f"{head}\n(log: {response.status_code} {response.text})")
                continue
            lines = [_log_line(entry) for entry in response.json()["content"]]
            parts.append("\n".join([head, *lines[-60:]]))
        return "\n".join(parts)

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                        f"{task_id}")

    def wait_for_state(self, dag_id: str, run_id: str, task_id: str, states: set[str],
                       timeout: float) -> dict:
        """The task instance once its state is one of `states`."""
        deadline = time.monotonic() + timeout
        ti = self.task_instance(dag_id, run_id, task_id)
        while ti["state"] not in states and time.monotonic() < deadline:
            time.sleep(0.25)
            ti = self.task_instance(dag_id, run_id, task_id)
        if ti["state"] not in states:
            raise AssertionError(f"{task_id} of {run_id} is {ti['state']!r}, not one of "
                                 f"{sorted(states)} after {timeout:.0f} s\n"
                                 f"{self.task_logs(dag_id, run_id)}")
        return ti

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """As the UI's "Mark as failed/success" does."""
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
        response = self.http.patch(path, json={"new_state": state})
        assert response.status_code == 200, response.text

    def pool(self, name: str = "default_pool") -> dict:
        return self.get(f"/pools/{name}")

    def add_connection(self, conn_id: str, conn: dict) -> None:
        """A connection in the metadata database (what every service and task sees)."""
        body = {"connection_id": conn_id, "conn_type": conn["conn_type"],
                "host": conn.get("host"), "port": conn.get("port"),
                "login": conn.get("login"), "password": conn.get("password"),
                "extra": json.dumps(conn.get("extra") or {})}
        self.http.delete(f"/connections/{conn_id}")
        response = self.http.post("/connections", json=body)
        assert response.status_code == 201, response.text

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[str]:
        """The events of one try's log (the task's and the triggerer's), as the UI shows it."""
        path = (f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/"
                f"logs/{try_number}?full_content=true")
        response = self.http.get(path)
        assert response.status_code == 200, response.text
        return [str(e.get("event", "")) if isinstance(e, dict) else str(e)
                for e in response.json()["content"]]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = (f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/"
                f"xcomEntries/{key}")
        return self.get(path)["value"]


def _airflow_shutdown_hang(pid: int, cmdline: str, mains: set[int]) -> bool:
    """Whether a process left after SIGTERM is only Airflow's own shutdown hang, not work:
    a service's main process or an idle LocalExecutor worker. The scheduler can wait at exit
    for an idle worker that never gets its stop message (seen with Airflow 3.3: its main
    thread in multiprocessing's exit handler joining a worker blocked on the empty task
    queue; apache/airflow#67870 is the same family). Killed all the same; not a leftover."""
    return pid in mains or cmdline.endswith("LocalExecutor: <idle>")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "gone"
