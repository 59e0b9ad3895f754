"""The one launcher component both operators run on. A `Launcher` reaches its hosts through
shells (this host, or SSH), and for a task try it can: prepare the hosts (interpreters,
numpy, the runtime shipped, free ports, files), start a job's parts detached under ringflow's
supervisor (`ringflow.launch.supervisor`), attach to a job from given offsets (a line stream
until it ends; the first part that fails stops the others), tell its status, stop it, and
find what earlier tries of the task left (to attach to it, or to stop it). A backend says
only what differs: how its hosts are reached and what command each host runs for a job of
ringflow launcher agents (`agent_parts`); `launchers/__init__.py` registers them by name.
The watch of an attached job lives in `launchers.watch`, the reading of the hosts' clocks
in `launchers.clocks`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from ringflow.errors import ConfigError, FolderError, LaunchError, gathered
from ringflow.launch import jobdir
from ringflow.launch.exits import FOLDER_REFUSED_EXIT
from ringflow.launch.stdin import ENV_KEY, MASK_KEY
from ringflow.launch.supervisor import STARTED_PREFIX
from ringflow_provider.hooks.allowed_hosts import HostNotAllowedError
from ringflow_provider.launchers import commands, watch
from ringflow_provider.launchers.clocks import clock_offsets
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.job import JobHandle, Part, TaskKey
from ringflow_provider.launchers.lines import lines_of
from ringflow_provider.launchers.shells import Shell
from ringflow_provider.launchers.watch import LineHandler

T = TypeVar("T")
TASK_VAR = "RINGFLOW_TASK"       # every process of a task's jobs carries the task's key
STOP_BUDGET_S = 1.8              # Airflow SIGKILLs about 5 s after the SIGTERM of on_kill
COMMAND_TIMEOUT_S = 30.0
STOP_EARLIER_WAIT_S = 20.0
MAX_PEEK_BYTES = 1 << 20


class Launcher:
    """Hosts of a job and the lifecycle of its parts; see the module docstring."""

    name: ClassVar[str] = ""
    #: the task log tags each line with its host (several hosts, or a remote one)
    show_hosts: ClassVar[bool] = True

    def __init__(self, hosts: Sequence[str], *, log: Any, python: str = "python3",
                 conns: Mapping[str, str] | None = None, state_dir: str | None = None,
                 conn_timeout: float = 10.0) -> None:
        self.hosts = list(hosts)
        self.log = log
        self.python = python
        self.conns = dict(conns or {})
        self.conn_timeout = conn_timeout
        self.state_dir = state_dir or self.default_state_dir()
        self.runtimes: dict[str, Runtime] = {}
        self.homes: dict[str, str] = {}
        self._shells: dict[str, Shell] = {}

    # -- what a backend says ---------------------------------------------------------------
    def default_state_dir(self) -> str:
        """Where job folders go on the hosts: `<state_dir>/<task key>/try-<n>`."""
        return ".ringflow/jobs"

    def make_shell(self, host: str) -> Shell:
        raise NotImplementedError

    def prepare_hosts(self, *, numpy: bool = True, hosts: Sequence[str] | None = None
                      ) -> None:
        """Every host (default: the launcher's) checked and given the runtime."""
        raise NotImplementedError

    def agent_parts(self, agent_args: Sequence[str], *, nproc_per_host: int, log_dir: str,
                    base_port: int | None, env: Mapping[str, str]
                    ) -> list[tuple[str, list[str]]]:
        """(host, argv) of each part of a job of ringflow launcher agents, `agent_args` being
        what every agent runs (`-m ringflow.train spec.json`); `env` names the variables
        every agent must get (a backend whose agents start elsewhere passes them on)."""
        raise NotImplementedError

    def free_base_port(self, count: int) -> int | None:
        """A first port such that `count` ports from it are free on every host; None when
        the agents may pick their own (one host)."""
        return None

    def check_allowed(self) -> None:
        """HostNotAllowedError for a host of the job that the connection reaching it does
        not allow (its ``allowed_hosts`` extra); called before anything connects."""

    def stop_leftovers(self, task: TaskKey) -> None:
        """After earlier tries' supervisors are stopped: what those tries left that no
        supervisor watched (a backend whose agents start without one)."""

    # -- hosts -----------------------------------------------------------------------------
    def shell(self, host: str) -> Shell:
        if host not in self._shells:
            self._shells[host] = self.make_shell(host)
        return self._shells[host]

    def runtime(self, host: str) -> Runtime:
        return self.runtimes.get(host) or Runtime(self.python)

    def prepare(self, *, numpy: bool = True, hosts: Sequence[str] | None = None,
                writable: Mapping[str, str | None] | None = None) -> None:
        """Every host (default: the launcher's) checked and given the runtime
        (`prepare_hosts`); then each folder of `writable` (what it is -> its path, relative
        to the login's home) made if missing and written to on every host, before any part
        of a job starts: a FolderError names each host, folder and cause."""
        self.prepare_hosts(numpy=numpy, hosts=hosts)
        folders = {what: path for what, path in (writable or {}).items() if path}
        if folders:
            self.on_every_host(lambda host: self.check_writable(host, folders),
                               "checking the job's folders", hosts)

    def check_writable(self, host: str, folders: Mapping[str, str]) -> None:
        code, out, err = self.run(host, commands.writable_command(list(folders.values())))
        found = commands.unwritable(out)
        if code != 0 and not found:
            said = (err.strip() or out.strip() or f"exit {code}").splitlines()[-1]
            raise LaunchError(f"host {host!r}: the job's folders could not be checked: "
                              f"{said}")
        if found:
            names = {path: what for what, path in folders.items()}
            raise FolderError(f"host {host!r}: " + "; ".join(
                f"{names.get(path, 'folder')} {path} is not writable: {cause}"
                for path, cause in found))

    def on_every_host(self, work: Callable[[str], T], what: str,
                      hosts: Sequence[str] | None = None) -> dict[str, T]:
        """`work(host)` on every host at once; one LaunchError naming every host that
        failed."""
        targets = list(dict.fromkeys(self.hosts if hosts is None else hosts))

        def attempt(host: str) -> T | LaunchError:
            try:
                return work(host)
            except LaunchError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
            results = dict(zip(targets, pool.map(attempt, targets)))
        problems = [r for r in results.values() if isinstance(r, LaunchError)]
        refused = [r for r in problems if isinstance(r, HostNotAllowedError)]
        if refused:  # not retried: it must not hide among errors a retry may cure
            raise refused[0]
        if problems:
            raise gathered(what, problems)
        return results  # type: ignore[return-value]

    def run(self, host: str, command: str, timeout: float = COMMAND_TIMEOUT_S,
            stdin: str = "") -> tuple[int, str, str]:
        return self.shell(host).run(command, timeout, stdin)

    def mem_available(self) -> dict[str, int]:
        """Each host's MemAvailable in bytes (its /proc/meminfo), read on all at once."""
        from ringflow.train.memory import parse_meminfo  # numpy: not for the triggerer

        def read(host: str) -> int:
            code, out, err = self.run(host, commands.meminfo_command())
            try:
                if code != 0:
                    raise ConfigError(err.strip() or f"exit {code}")
                return parse_meminfo(out)
            except ConfigError as exc:
                raise LaunchError(f"host {host!r}: cannot read /proc/meminfo: {exc}") from None

        return self.on_every_host(read, "reading the hosts' MemAvailable")

    def put_file(self, host: str, path: str, text: str) -> None:
        """Write `text` to `path` on `host` (its folder made), 0600."""
        raise NotImplementedError

    def close(self) -> None:
        for shell in self._shells.values():
            shell.close()
        self._shells.clear()

    # -- starting --------------------------------------------------------------------------
    def job_dir(self, task: TaskKey) -> str:
        return f"{self.state_dir}/{task.key}/try-{task.try_number}"

    def start(self, task: TaskKey, parts: Sequence[tuple[str, list[str]]], *, job_id: str,
              env: Mapping[str, str], secrets: Mapping[str, str], secrets_to: str = "stdin",
              lease_timeout: float | None, grace_s: float = 10.0, log_dir: str | None = None,
              checkpoint_dir: str | None = None, gathered: bool = False,
              show_hosts: bool | None = None, masks: Sequence[str] = (),
              extra: Mapping[str, Any] | None = None) -> JobHandle:
        """Start every part detached under the supervisor; the secrets go on stdin (into
        the command's environment, or on as its stdin's first line), with `masks`: more
        values the supervisor masks in the job's output. If a part cannot be started, the
        parts already started are stopped."""
        handle = JobHandle(
            launcher=self.name, job_id=job_id, task=task, hosts=tuple(self.hosts),
            parts=tuple(Part(host, self.job_dir(task), self.conns.get(host))
                        for host, _ in parts),
            python=self.runtime(parts[0][0]).python,
            pythonpath=self.runtime(parts[0][0]).pythonpath, gathered=gathered,
            show_hosts=self.show_hosts if show_hosts is None else show_hosts, log_dir=log_dir,
            checkpoint_dir=checkpoint_dir,
            lease_timeout=lease_timeout, started_at=time.time(), extra=dict(extra or {}))
        line = json.dumps({ENV_KEY: dict(secrets),
                           MASK_KEY: [m for m in masks if m]}, separators=(",", ":")) + "\n"
        record = handle.to_dict()
        full_env = {**env, "RINGFLOW_JOB_ID": job_id, TASK_VAR: task.key}

        def start_part(host: str) -> dict[str, Any]:
            argv = dict(parts)[host]
            runtime = self.runtime(host)
            part_env = dict(full_env)
            if runtime.pythonpath:
                part_env["PYTHONPATH"] = runtime.pythonpath
            command = commands.start_command(
                runtime, self.job_dir(task), argv, env=part_env, secrets=secrets_to,
                lease_timeout=lease_timeout, grace_s=grace_s, handle=record,
                secret_names=list(secrets))
            code, out, err = self.run(host, command, stdin=line)
            started = [x for x in out.splitlines() if x.startswith(STARTED_PREFIX)]
            if code != 0 or not started:
                said = (err.strip() or out.strip() or f"exit {code}").splitlines()[-1]
                if code == FOLDER_REFUSED_EXIT:
                    raise FolderError(f"host {host!r}: {said}")
                raise LaunchError(f"host {host!r}: the job could not be started: {said}")
            return json.loads(started[-1][len(STARTED_PREFIX):])

        try:
            said = self.on_every_host(start_part, "starting the job", [h for h, _ in parts])
        except LaunchError:
            self.stop(handle, "another part of the job could not be started")
            raise
        for host, info in said.items():
            self.log.info("job %s started on %s under ringflow's supervisor (pid %s) as "
                          "process group %s, folder %s", job_id, host,
                          info.get("supervisor_pid"), info.get("pgid"), self.job_dir(task))
        handle.extra["started"] = {host: {k: info.get(k) for k in (
            "pid", "pgid", "supervisor_pid")} for host, info in said.items()}
        handle.extra["clock_offsets"] = clock_offsets(self)
        return handle

    # -- watching --------------------------------------------------------------------------
    def attach(self, handle: JobHandle, on_line: LineHandler, *,
               offsets: Mapping[str, int] | None = None, tie: bool = False, renew: bool = True,
               should_stop: Callable[[], bool] = lambda: False) -> dict[str, dict[str, Any]]:
        """Stream every part's output from `offsets` (default 0) until all have ended (or
        `should_stop()`); each line goes to `on_line`. Returns each part's final status
        (status.json, with `state` and `offset`). The first part that fails stops the
        others. With `tie`, the parts stop if this process goes away (`launchers.watch`)."""
        return watch.attach(self, handle, on_line, offsets=offsets, tie=tie, renew=renew,
                            should_stop=should_stop)

    def runtime_of(self, handle: JobHandle, part: Part) -> Runtime:
        return Runtime(handle.python, handle.pythonpath)

    def peek(self, handle: JobHandle, part: Part, offset: int = 0,
             max_bytes: int = MAX_PEEK_BYTES) -> jobdir.Peek:
        _, out, _ = self.run(part.host, jobdir.peek_command(part.job_dir, offset, max_bytes))
        return jobdir.parse_peek(out.encode())

    def read_all(self, handle: JobHandle, on_line: LineHandler, skip: Sequence[str] = ()
                 ) -> tuple[dict[str, int], dict[str, jobdir.Peek]]:
        """Every line each part printed so far, to `on_line`; returns where each part's
        output ends now and each part's last look (its status); parts on `skip`'s hosts
        (lost) are left out."""
        offsets: dict[str, int] = {}
        looks: dict[str, jobdir.Peek] = {}
        for part in handle.parts:
            if part.host in skip:
                continue
            offset = 0
            while True:
                look = self.peek(handle, part, offset)
                for line in lines_of(look.data, handle, part.host):
                    on_line(line)
                offset += len(look.data)
                if not look.data:
                    break
            offsets[part.host], looks[part.host] = offset, look
        return offsets, looks

    def stop(self, handle: JobHandle, why: str, timeout: float = STOP_BUDGET_S,
             skip: str | None = None) -> dict[str, str]:
        """Ask every part's supervisor to stop (TERM, KILL after its grace); returns within
        about `timeout` with what each host said ("" where none answered in time)."""
        said: dict[str, str] = {}

        def stop_part(part: Part) -> None:
            try:
                _, out, err = self.run(part.host, commands.stop_command(
                    self.runtime_of(handle, part), part.job_dir, why), timeout=timeout)
                said[part.host] = (out + err).strip()
                self.log.info("stopping the job on %s: %s", part.host, said[part.host])
            except LaunchError as exc:  # a stop must never raise into Airflow's on_kill
                self.log.error("could not reach %s to stop job %s: %s", part.host,
                               handle.job_id, exc)

        senders = [threading.Thread(target=stop_part, args=(p,), daemon=True)
                   for p in handle.parts if p.host != skip]
        for t in senders:
            t.start()
        deadline = time.monotonic() + timeout
        for t in senders:
            t.join(max(0.0, deadline - time.monotonic()))
        return said

    def sweep_shm(self, job_id: str, runtime: Runtime,
                  hosts: Sequence[str] | None = None) -> dict[str, str]:
        """Remove what a ringflow job left in /dev/shm on every host (this user's segments
        whose creator is gone: ringflow's own rule); what each host said. Best effort: a
        host that cannot be reached says so, it is no failure of its own."""
        def sweep(host: str) -> str:
            try:
                code, out, err = self.run(host, commands.sweep_command(runtime, job_id),
                                          timeout=self.conn_timeout)
            except LaunchError as exc:
                return str(exc)
            said = (out + err).strip().splitlines()
            return said[-1] if said else f"exit {code}"

        return self.on_every_host(sweep, "sweeping shared memory", hosts)

    # -- earlier tries ---------------------------------------------------------------------
    def task_jobs(self, task: TaskKey) -> list[JobHandle]:
        """The jobs of earlier tries of `task` that this launcher's first host knows of,
        newest first."""
        host = self.hosts[0]
        _, out, _ = self.run(host, commands.task_jobs_command(f"{self.state_dir}/{task.key}"))
        found = []
        for line in out.splitlines():
            record = line.partition("\t")[2]
            try:
                handle = JobHandle.from_dict(json.loads(record))
            except (ValueError, TypeError, KeyError):
                continue
            if handle.task.try_number < task.try_number and handle.launcher == self.name:
                found.append(handle)
        return sorted(found, key=lambda h: h.task.try_number, reverse=True)

    def running(self, handle: JobHandle) -> dict[str, jobdir.Peek] | None:
        """Each part's look when every part runs with a fresh lease, else None."""
        looks = self.on_every_host(
            lambda host: self.peek(handle, next(p for p in handle.parts if p.host == host),
                                   0, 0), "looking at an earlier try's job",
            [p.host for p in handle.parts])
        for look in looks.values():
            timeout = (look.status or {}).get("lease_timeout_s")
            fresh = timeout is None or (look.lease_age is not None and look.lease_age < timeout)
            if look.state != jobdir.RUNNING or not look.alive or not fresh:
                return None
        return looks

    def stop_earlier(self, task: TaskKey, why: str) -> None:
        """Stop whatever earlier tries of the task still run, and wait for them to end."""
        for handle in self.task_jobs(task):
            for part in handle.parts:
                try:
                    look = self.peek(handle, part, 0, 0)
                except LaunchError:
                    continue
                if look.alive:
                    _, out, err = self.run(part.host, commands.stop_command(
                        self.runtime_of(handle, part), part.job_dir, why, STOP_EARLIER_WAIT_S),
                        timeout=STOP_EARLIER_WAIT_S + 10)
                    self.log.info("host %s: try %d's job was still running: %s", part.host,
                                  handle.try_number, (out + err).strip())
        self.stop_leftovers(task)

