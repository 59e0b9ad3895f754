"""PopRunOperator: compose a Graphcore PopRun command and run it on a launch host over SSH."""

from __future__ import annotations

import secrets as token_source
import shlex
import signal
import threading
import time
import uuid
from collections.abc import Container
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from pydantic import TypeAdapter

from ringflow.errors import LaunchError, RingflowError
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.jobs.masking import Secrets
from ringflow_provider.jobs.ssh import ON_KILL_BUDGET_S, SSHJob
from ringflow_provider.launchers.shipping import prepare_hosts
from ringflow_provider.poprun import (
    FIELD_NAMES,
    PopRunConfig,
    launch_argv,
    mask_argv,
    parse_config,
    secret_values,
    validate_field,
)
from ringflow_provider.poprun.models import check_host
from ringflow_provider.remote_job import (
    KILL_GRACE_S,
    JobId,
    find_executable_command,
    sweep_command,
)

__all__ = ["CPU_POPRUN", "ON_KILL_BUDGET_S", "PopRunOperator"]

# poprun=CPU_POPRUN: ringflow's CPU poprun (`ringflow.poprun`) from the shipped runtime.
CPU_POPRUN = "ringflow-poprun"

_BOOL = TypeAdapter(bool)


def _templated(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, (list, tuple)):
        return any(_templated(v) for v in value)
    if isinstance(value, dict):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    return False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class PopRunOperator(BaseOperator):
    """Run a PopRun job (the command Paddle's IPUController composes) on a launch host via SSH.

    Every PopRun field is validated with pydantic (``PopRunConfig``): literal values when the
    DAG is parsed, templated ones when the task runs. List and dict fields also take the JSON
    text a template renders to.

    :param hosts: hosts running instances, a comma string or a list (templated)
    :param nproc_per_host: instances per host (templated)
    :param ipus_per_replica: IPUs per replica (templated)
    :param num_ipus: IPUs in total (templated)
    :param ipu_partition: V-IPU partition (templated)
    :param vipu_server: V-IPU server host (templated)
    :param training_script: the script every instance runs (templated)
    :param training_script_args: its arguments, a list (templated)
    :param python: interpreter on the hosts, default ``python3`` (templated)
    :param popart_log_level: exported to every instance as POPART_LOG_LEVEL (templated)
    :param endpoint_port: port of the per-host PADDLE endpoints, default 8090 (templated)
    :param update_partition: ``--update-partition`` yes/no, default False (templated)
    :param vipu_server_timeout: ``--vipu-server-timeout`` seconds, default 120 (templated)
    :param print_topology: ``--print-topology`` yes/no, default True (templated)
    :param numa_aware: ``--numa-aware`` yes/no, default True (templated)
    :param mpi_global_args: tokens of ``--mpi-global-args`` (templated)
    :param extra_poprun_args: further poprun flags, placed before the interpreter (templated)
    :param extra_env: variables exported to every instance with mpirun ``-x``; values under
        secret names (containing secret/password/token/key, or that Airflow's masker hides)
        are secret: masked everywhere and sent as secret_env values are (templated)
    :param secret_env: variables whose values are always secret: sent over the SSH
        channel's stdin, exported by the remote shell, passed to mpirun as a bare ``-x
        NAME``, so they sit on no command line; masked everywhere (templated)
    :param ringflow_job: the instances are ringflow workers: a job id (``-x
        RINGFLOW_JOB_ID=<id>``) and a job token (secret, a bare ``-x RINGFLOW_JOB_TOKEN``)
        are made per try, so the instances can rendezvous; default False (templated)
    :param poprun: the poprun executable on the launch host, default ``poprun``; with
        ``ringflow-poprun`` the job runs on CPU hosts: the ringflow runtime is shipped to
        every host and ``<python> -m ringflow.poprun`` (Open MPI's mpirun underneath) runs
        the same command line (templated)
    :param ssh_conn_id: an ``ssh`` connection whose credentials reach every host (templated)
    :param launch_host: where poprun runs; default the first host (templated)
    :param preflight: check every host over SSH and poprun on the launch host first
    :param dry_run: render, validate and log the command only; no SSH at all (templated)
    :param conn_timeout: seconds for each SSH connect, banner and authentication
    :param cmd_timeout: seconds without output before failing; None (default) = no limit
    :param skip_on_exit_code: exit code(s) that mark the task skipped instead of failed
    :param remote_state_dir: directory on the launch host for the jobs' pid files;
        default ``$HOME/.ringflow/jobs``
    """

    template_fields = (*FIELD_NAMES, "ssh_conn_id", "launch_host", "dry_run", "ringflow_job")
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "training_script_args": "json",
        "extra_env": "json",
        "secret_env": "json",
        "mpi_global_args": "json",
        "extra_poprun_args": "json",
    }
    template_ext = ()
    ui_color = "#c9e7f5"

    def __init__(
        self,
        *,
        hosts: str | list[str],
        nproc_per_host: int | str,
        ipus_per_replica: int | str,
        num_ipus: int | str,
        ipu_partition: str,
        vipu_server: str,
        training_script: str,
        training_script_args: list[str] | str | None = None,
        python: str = "python3",
        popart_log_level: str | None = None,
        endpoint_port: int | str = 8090,
        update_partition: bool | str = False,
        vipu_server_timeout: int | str = 120,
        print_topology: bool | str = True,
        numa_aware: bool | str = True,
        mpi_global_args: list[str] | str | None = None,
        extra_poprun_args: list[str] | str | None = None,
        extra_env: dict[str, str] | str | None = None,
        secret_env: dict[str, str] | str | None = None,
        poprun: str = "poprun",
        ssh_conn_id: str = MultiHostSSHHook.default_conn_name,
        launch_host: str | None = None,
        preflight: bool = True,
        dry_run: bool | str = False,
        ringflow_job: bool | str = False,
        conn_timeout: float = 10,
        cmd_timeout: float | None = None,
        skip_on_exit_code: int | Container[int] | None = None,
        remote_state_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retries", 1)
        super().__init__(**kwargs)
        given = locals()
        for name in FIELD_NAMES:
            setattr(self, name, given[name])
        if self.training_script_args is None:
            self.training_script_args = []
        self.ssh_conn_id = ssh_conn_id
        self.launch_host = launch_host
        self.preflight = preflight
        self.dry_run = dry_run
        self.ringflow_job = ringflow_job
        self.conn_timeout = conn_timeout
        self.cmd_timeout = cmd_timeout
        self.skip_on_exit_code = self._exit_codes(skip_on_exit_code)
        self.remote_state_dir = remote_state_dir
        # Plain flags, not threading.Event: Airflow deep-copies operators, locks cannot be.
        self._killed = False
        self._stop_streaming = False
        self._job: JobId | None = None
        self._remote: SSHJob | None = None  # the job lifecycle (ringflow_provider.jobs)
        self._sweep: tuple[str, str, list[str]] | None = None  # (python, job id, hosts)
        self._secrets = Secrets()
        self._validate_literals()

    @staticmethod
    def _exit_codes(codes: int | Container[int] | None) -> frozenset[int]:
        if codes is None:
            return frozenset()
        if isinstance(codes, int):
            return frozenset({codes})
        return frozenset(codes)  # type: ignore[arg-type]

    def _validate_literals(self) -> None:
        """Cheap parse-time check of the non-templated arguments (no I/O)."""
        values = {name: getattr(self, name) for name in FIELD_NAMES}
        try:
            if not any(_templated(v) for v in values.values()):
                parse_config(values)
            else:
                for name, value in values.items():
                    if not _templated(value):
                        validate_field(name, value)
            if self.launch_host and not _templated(self.launch_host):
                check_host(self.launch_host)
        except (RingflowError, ValueError) as exc:
            message = self._given_secrets().mask(str(exc))
            raise AirflowException(f"task {self.task_id!r}: {message}") from None

    def _given_secrets(self) -> Secrets:
        """The secret values among the arguments as they stand (maybe not valid yet)."""
        return Secrets().add_env(self.extra_env).add_env(self.secret_env, all_secret=True)

    @cached_property
    def hook(self) -> MultiHostSSHHook:
        return MultiHostSSHHook(self.ssh_conn_id, self.conn_timeout, self.cmd_timeout)

    @staticmethod
    def _flag(name: str, value: bool | str) -> bool:
        try:
            return _BOOL.validate_python(value)
        except ValueError:
            raise AirflowFailException(f"{name}: expected a boolean, got {value!r}") from None

    def _config(self) -> PopRunConfig:
        """The rendered arguments, validated; a bad value fails the task without retries."""
        try:
            config = parse_config({name: getattr(self, name) for name in FIELD_NAMES})
            if self.launch_host:
                try:
                    check_host(self.launch_host.strip())
                except ValueError as exc:
                    raise ValueError(f"launch_host: {exc}") from None
        except (RingflowError, ValueError) as exc:  # validation messages quote values
            raise AirflowFailException(self._given_secrets().mask(str(exc))) from None
        return config

    @property
    def _pgid(self) -> int | None:
        """The remote job's process group, once its launch script has said it."""
        return self._remote.pgid if self._remote is not None else None

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render, then register secret values with the masker at once, so the rendered
        fields Airflow stores and shows (before execute) have them masked too."""
        super().render_template_fields(context, jinja_env)
        self._secrets = self._given_secrets()
        self._secrets.register()

    def _collect_secrets(self, config: PopRunConfig, token: str | None) -> list[str]:
        password = None
        if not self.dry_run:
            password = self.hook.get_connection(self.ssh_conn_id).password
        secrets = secret_values(config, [password, token])
        self._secrets = Secrets(secrets)
        self._secrets.register()
        return secrets

    def execute(self, context: Any) -> dict[str, Any]:
        self.dry_run = self._flag("dry_run", self.dry_run)
        ringflow_job = self._flag("ringflow_job", self.ringflow_job)
        config = self._config()
        launch_host = (self.launch_host or "").strip() or config.hosts[0]
        job_vars, job_secrets = {}, {}
        if ringflow_job:  # per try: the instances' rendezvous identity
            job_vars = {"RINGFLOW_JOB_ID": uuid.uuid4().hex[:12]}
            self._sweep = (config.python, job_vars["RINGFLOW_JOB_ID"], list(config.hosts))
            job_secrets = {"RINGFLOW_JOB_TOKEN": token_source.token_hex(32)}
        hidden = {**config.hidden_env(), **job_secrets}
        argv = launch_argv(config, secret=list(job_secrets), plain=job_vars)
        secrets = self._collect_secrets(config, hidden.get("RINGFLOW_JOB_TOKEN"))
        masked = mask_argv(argv, secrets)
        summary: dict[str, Any] = {
            "argv": masked, "num_instances": config.num_instances,
            "num_replicas": config.num_replicas, "launch_host": launch_host,
            "exit_code": None, "duration_s": 0.0, "dry_run": self.dry_run,
        }
        self._log_plan(config, launch_host, masked)
        if self.dry_run:
            self.log.info("dry_run: validated and rendered only; nothing was started (with "
                          "dry_run False it runs on %s over SSH connection %r)", launch_host,
                          self.ssh_conn_id)
            return summary
        started = time.monotonic()
        try:
            exit_code, tail = self._run(context, config, argv, launch_host, hidden)
        except RingflowError as exc:
            raise AirflowException(self._stop_after_failure(str(exc), launch_host)) from None
        finally:
            self.hook.close()
        summary["exit_code"] = exit_code
        summary["duration_s"] = round(time.monotonic() - started, 3)
        self._check_exit(exit_code, tail, launch_host)
        self.log.info("PopRun job %s on %s succeeded after %.1f s", self._job, launch_host,
                      summary["duration_s"])
        return summary

    def _log_plan(self, config: PopRunConfig, launch_host: str, masked: list[str]) -> None:
        hosts = len(config.hosts)
        self.log.info(
            "PopRun job: %d instance(s) (%d per host on %d host%s: %s), %d replica(s) of %d "
            "IPU(s), partition %r on V-IPU server %r", config.num_instances,
            config.nproc_per_host, hosts, "" if hosts == 1 else "s", ",".join(config.hosts),
            config.num_replicas, config.ipus_per_replica, config.ipu_partition,
            config.vipu_server)
        # One token per line, as the seed prints it; still a valid shell command.
        self.log.info("PopRun command on %s:\n%s", launch_host,
                      " \\\n    ".join(shlex.quote(token) for token in masked))

    def _run(self, context: Any, config: PopRunConfig, argv: list[str], launch_host: str,
             hidden: dict[str, str]) -> tuple[int, list[str]]:
        env = config.plain_env()
        if config.poprun == CPU_POPRUN:
            argv, env["PYTHONPATH"] = self._cpu_poprun(config, argv, launch_host)
        elif self.preflight:
            path = self.hook.check_hosts(config.hosts, launch_host, config.poprun,
                                         find_executable_command(config.poprun))
            self.log.info("preflight passed: SSH to %s works (connection %r); %s on %s is %s",
                          ", ".join(config.hosts), self.ssh_conn_id, config.poprun,
                          launch_host, path)
        ti = context["ti"]
        self._job = JobId(ti.dag_id, ti.task_id, ti.run_id, int(ti.try_number))
        self._remote = SSHJob(self.hook, launch_host, self._job, argv, self._log_line,
                              env=env, secret_env=hidden,
                              state_dir=self.remote_state_dir,
                              log=self.log, should_stop=lambda: self._stop_streaming)
        if self._killed:  # on_kill came during preflight: start nothing
            return -1, []
        self._remote.start()
        code = self._remote.wait()
        if not self._killed:
            self._sweep_segments()
        return code, self._remote.tail

    def _cpu_poprun(self, config: PopRunConfig, argv: list[str],
                    launch_host: str) -> tuple[list[str], str]:
        """Ship the runtime to every host (always: the instances import it) and check
        mpirun on the launch host; returns the argv to run and the instances' PYTHONPATH."""
        hosts = list(dict.fromkeys([*config.hosts, launch_host]))
        prepared = prepare_hosts(self.hook, hosts, config.python)
        for host in hosts:
            self.log.info("%s", prepared[host].describe())
        pythonpath = prepared[launch_host].shipped.pythonpath
        elsewhere = {h: p.shipped.pythonpath for h, p in prepared.items()
                     if p.shipped.pythonpath != pythonpath}
        if elsewhere:  # mpirun gives every instance the launch host's PYTHONPATH
            raise LaunchError(
                f"the runtime is at {pythonpath} on launch host {launch_host!r} but at "
                + ", ".join(f"{p} on {h!r}" for h, p in elsewhere.items())
                + ": ringflow-poprun exports one PYTHONPATH to every instance, so the SSH "
                "login's home must be the same path on every host")
        code, out, _ = self.hook.run(launch_host, find_executable_command("mpirun"),
                                     timeout=self.conn_timeout)
        if code != 0:
            raise LaunchError(f"Open MPI's mpirun not found on launch host {launch_host!r} "
                              f"(ringflow-poprun runs the instances with it; Debian: apt "
                              f"install openmpi-bin)")
        self.log.info("ringflow-poprun: CPU poprun as %s -m ringflow.poprun on %s, mpirun %s",
                      config.python, launch_host, out.strip())
        return [config.python, "-m", "ringflow.poprun", *argv[1:]], pythonpath

    def _sweep_segments(self, after_s: int = 0) -> None:
        """Remove what the ringflow job left in /dev/shm on every host of the job (segments of
        this user whose creator is gone: ringflow's own rule), now that it has ended, or
        detached `after_s` later (on kill: after the SIGKILL). Best effort: a host that
        cannot be reached is logged, never a failure of its own."""
        if self._sweep is None:
            return
        python, job_id, hosts = self._sweep
        timeout = ON_KILL_BUDGET_S if after_s else self.conn_timeout

        def sweep(host: str) -> str:
            try:
                code, out, err = self.hook.run(host, sweep_command(python, job_id, after_s),
                                               timeout=timeout)
            except RingflowError as exc:
                return f"shm sweep on {host}: {exc}"
            said = (out + err).strip().splitlines()
            return f"shm sweep on {host}: {said[-1] if said else f'exit {code}'}"

        with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
            for said in pool.map(sweep, hosts):
                self.log.info("%s", said)

    def _log_line(self, stream: str, line: str) -> None:
        # Airflow's masker redacts task logs too; masking here also covers logs outside a task.
        line = self._secrets.mask(line)
        if stream == "stdout":
            self.log.info("%s", line)
        else:
            self.log.warning("%s", line)

    def _check_exit(self, exit_code: int, tail: list[str], host: str) -> None:
        if self._killed:
            raise AirflowException(f"PopRun job {self._job} on {host!r} was killed (on_kill)")
        if exit_code == 0:
            return
        if exit_code in self.skip_on_exit_code:
            raise AirflowSkipException(f"PopRun exited with {exit_code} on {host!r}: skipped")
        lines = "\n".join(tail)
        how = f"with exit code {exit_code}"
        if exit_code == -1:
            how = ("without an exit status (exit code -1: the remote shell itself was ended "
                   "by a signal)")
        elif 128 < exit_code <= 128 + 64:
            how += f" (128+{exit_code - 128}: ended by signal {_signal_name(exit_code - 128)})"
        raise AirflowException(self._secrets.mask(
            f"PopRun failed on {host!r} {how}; last {len(tail)} lines:\n{lines}"))

    def on_kill(self) -> None:
        """Kill the remote process group with one detached command; return within 2 s."""
        self._killed = True
        if self._remote is not None:
            deadline = time.monotonic() + ON_KILL_BUDGET_S
            # the hosts' delayed shm sweeps go out while the kill does, in the same budget
            sweeper = threading.Thread(target=self._sweep_segments, daemon=True,
                                       kwargs={"after_s": KILL_GRACE_S + 2})
            sweeper.start()
            self._remote.stop("on_kill", ON_KILL_BUDGET_S)
            sweeper.join(max(deadline - time.monotonic(), 0))
        self._stop_streaming = True

    def _stop_after_failure(self, error: str, host: str) -> str:
        """A started job outlives a lost stream (cmd_timeout, dropped link) and Airflow calls
        no on_kill after an exception: stop it here. Returns the masked failure message."""
        message = self._secrets.mask(error)
        if self._remote is None or self._remote.pgid is None or self._killed:
            return message
        said = self._remote.stop("after the failure", self.conn_timeout, block=True)
        return f"{message}; on {host!r}: {said}" if said else message
