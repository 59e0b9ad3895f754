"""PopRunOperator: compose a Graphcore PopRun command and run it on a launch host over SSH,
under ringflow's job supervisor there (`launchers`): watched here or by the triggerer, its
output streamed into the task log, stopped when the task is killed."""

from __future__ import annotations

import secrets as token_source
import time
import uuid
from collections.abc import Container
from functools import cached_property
from typing import Any, ClassVar

from ringflow.errors import LaunchError, RingflowError
from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowHostUnreachableException,
    RingflowJobKilledException,
    RingflowLaunchException,
    launch_exception,
)
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.jobs.masking import Secrets
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.base import STOP_BUDGET_S
from ringflow_provider.launchers.job import JobHandle, TaskKey
from ringflow_provider.launchers.mpirun import check_mpirun, same_runtime_path
from ringflow_provider.launchers.ssh import SSHLauncher
from ringflow_provider.operators.base import RingflowJobOperator
from ringflow_provider.poprun import FIELD_NAMES, PopRunConfig, arguments, compose
from ringflow_provider.poprun import report as poprun_report
from ringflow_provider.poprun.models import ALLOW_FIELDS

__all__ = ["CPU_POPRUN", "ON_KILL_BUDGET_S", "PopRunOperator"]

# poprun=CPU_POPRUN: ringflow's CPU poprun (`ringflow.poprun`) from the shipped runtime.
CPU_POPRUN = "ringflow-poprun"
ON_KILL_BUDGET_S = STOP_BUDGET_S
KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL of poprun's process group when the job is stopped


class PopRunOperator(RingflowJobOperator):
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
    :param mpi_global_args: tokens of ``--mpi-global-args`` (templated); mpirun options
        that run commands, read option or host files, or write files (``--mca
        plm_rsh_agent``, ``--output-filename``, ``--prefix``, ``--hostfile``, ``-x
        LD_PRELOAD=...``, ...) are refused unless ``allow_unsafe_mpi_args``
    :param extra_poprun_args: further poprun flags, placed before the interpreter; not the
        flags the operator composes itself (``--host``, ``--num-instances``,
        ``--mpi-global-args``, ...: set their arguments instead), none twice, and no unsafe
        mpirun option (as for mpi_global_args) (templated)
    :param extra_env: variables exported to every instance with mpirun ``-x``; values under
        secret names (containing secret/password/token/key, or that Airflow's masker hides)
        are secret: masked everywhere and sent as secret_env values are. Variables that
        load code into every instance (``LD_*``, ``PYTHON*``, ``BASH_ENV``, ``ENV``,
        ``PATH``, ``OMPI_MCA_*`` of an agent or output parameter, ...) are refused unless
        ``allow_unsafe_env`` (templated)
    :param secret_env: variables whose values are always secret: sent over the SSH
        channel's stdin, exported by the remote shell, passed to mpirun as a bare ``-x
        NAME``, so they sit on no command line; masked everywhere; the names extra_env
        refuses are refused here too (templated)
    :param allow_unsafe_mpi_args: take the mpirun options mpi_global_args and
        extra_poprun_args refuse by default; default False. Not templated: only the DAG's
        author decides, never a trigger's params
    :param allow_unsafe_env: take the variables extra_env and secret_env refuse by default;
        default False. Not templated, as allow_unsafe_mpi_args
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
    :param remote_state_dir: folder on the launch host for the jobs' folders (output,
        status, lease); default ``$HOME/.ringflow/jobs``
    :param deferrable: hand the watch to Airflow's triggerer, freeing the worker slot while
        the job runs; default ``[operators] default_deferrable`` (False)
    :param poll_interval: seconds between the triggerer's looks, default 10
    :param lease_timeout: seconds the job runs on without a watcher before it stops itself,
        default 1800; None: never
    :param on_existing: ``reattach`` (default): a new try whose previous try's job still runs
        watches that job to its end; ``restart``: it stops that job and starts anew

    The job runs under ringflow's supervisor on the launch host (the runtime is shipped
    there: it needs python3 >= 3.10; numpy only with ``ringflow-poprun``).
    """

    template_fields = (*FIELD_NAMES, "ssh_conn_id", "launch_host", "dry_run", "ringflow_job",
                       *RingflowJobOperator.job_fields)
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
        allow_unsafe_mpi_args: bool = False,
        allow_unsafe_env: bool = False,
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
        super().__init__(**kwargs)
        given = locals()
        for name in (*FIELD_NAMES, *ALLOW_FIELDS):
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
        self.skip_on_exit_code = arguments.exit_codes(skip_on_exit_code)
        self.remote_state_dir = remote_state_dir
        if remote_state_dir:
            try:
                commands.check_state_dir(remote_state_dir)
            except ValueError as exc:
                raise RingflowConfigException(f"task {self.task_id!r}: remote_state_dir: "
                                              f"{exc}") from None
        self._sweep: tuple[str, str, list[str]] | None = None  # (python, job id, hosts)
        self._validate_literals()

    def _validate_literals(self) -> None:
        """Cheap parse-time check of the non-templated arguments (no I/O)."""
        try:
            arguments.check_literals(self._values(), self.launch_host)
        except (RingflowError, ValueError) as exc:
            message = self._given_secrets().mask(str(exc))
            raise RingflowConfigException(f"task {self.task_id!r}: {message}") from None

    def _values(self) -> dict[str, Any]:
        """PopRunConfig's fields as the operator holds them (rendered, in execute)."""
        return {name: getattr(self, name) for name in (*FIELD_NAMES, *ALLOW_FIELDS)}

    def _given_secrets(self) -> Secrets:
        """The secret values among the arguments as they stand (maybe not valid yet)."""
        return arguments.given_secrets(self.extra_env, self.secret_env)

    @cached_property
    def hook(self) -> MultiHostSSHHook:
        return MultiHostSSHHook(self.ssh_conn_id, self.conn_timeout, self.cmd_timeout)

    @staticmethod
    def _flag(name: str, value: bool | str) -> bool:
        try:
            return arguments.to_bool(name, value)
        except ValueError as exc:
            raise RingflowConfigException(str(exc)) from None

    def _config(self) -> PopRunConfig:
        """The rendered arguments, validated; a bad value fails the task without retries."""
        try:
            return arguments.parse_arguments(self._values(), self.launch_host)
        except (RingflowError, ValueError) as exc:  # validation messages quote values
            raise RingflowConfigException(self._given_secrets().mask(str(exc))) from None

    @property
    def _pgid(self) -> int | None:
        """The job's process group on the launch host, once it started."""
        if self._handle is None:
            return None
        started = self._handle.extra.get("started", {})
        return next((info.get("pgid") for info in started.values()), None)

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
        secrets = compose.secret_values(config, [password, token])
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
        argv = compose.launch_argv(config, secret=list(job_secrets), plain=job_vars)
        secrets = self._collect_secrets(config, hidden.get("RINGFLOW_JOB_TOKEN"))
        masked = compose.mask_argv(argv, secrets)
        summary = poprun_report.summary(config, masked, launch_host, self.dry_run)
        for text in poprun_report.plan_text(config, launch_host, masked):
            self.log.info("%s", text)
        if self.dry_run:
            self.log.info("dry_run: validated and rendered only; nothing was started (with "
                          "dry_run False it runs on %s over SSH connection %r)", launch_host,
                          self.ssh_conn_id)
            return summary
        self._result = summary
        self._run_started = time.monotonic()
        launcher = SSHLauncher(list(dict.fromkeys([launch_host, *config.hosts])), log=self.log,
                               python=config.python, conns={h: self.ssh_conn_id for h in
                                                            {launch_host, *config.hosts}},
                               state_dir=self.remote_state_dir,
                               conn_timeout=self.conn_timeout)
        launcher.hook(launch_host).cmd_timeout = self.cmd_timeout
        try:
            return self.run_job(context, launcher, lambda: self._start(
                context, launcher, config, argv, launch_host, hidden, job_vars, masked))
        except LaunchError as exc:
            raise launch_exception(exc, self._secrets.mask(str(exc))) from None
        finally:
            launcher.close()

    def _start(self, context: Any, launcher: SSHLauncher, config: PopRunConfig,
               argv: list[str], launch_host: str, hidden: dict[str, str],
               job_vars: dict[str, str], masked: list[str]) -> JobHandle:
        """Check the hosts, ship the runtime (the supervisor; all of it with ringflow-poprun),
        stop what an earlier try left, and start the command on the launch host."""
        env = config.plain_env()
        if config.poprun == CPU_POPRUN:
            hosts = list(dict.fromkeys([*config.hosts, launch_host]))
            launcher.prepare(numpy=True, hosts=hosts)
            same_runtime_path(launcher, "ringflow-poprun")
            check_mpirun(launcher, launch_host)
            self.log.info("ringflow-poprun: CPU poprun as %s -m ringflow.poprun on %s",
                          config.python, launch_host)
            argv = [config.python, "-m", "ringflow.poprun", *argv[1:]]
            env["PYTHONPATH"] = launcher.runtime(launch_host).pythonpath or ""
        else:
            if self.preflight:
                path = launcher.hook(launch_host).check_hosts(
                    config.hosts, launch_host, config.poprun,
                    commands.find_executable_command(config.poprun))
                self.log.info("preflight passed: SSH to %s works (connection %r); %s on %s is "
                              "%s", ", ".join(config.hosts), self.ssh_conn_id, config.poprun,
                              launch_host, path)
            launcher.prepare(numpy=False, hosts=[launch_host])
        task = TaskKey.from_ti(context["ti"])
        launcher.stop_earlier(task, f"try {task.try_number} starts the job again")
        self._raise_if_killed()
        handle = launcher.start(
            task, [(launch_host, argv)], job_id=job_vars.get("RINGFLOW_JOB_ID",
                                                             uuid.uuid4().hex[:12]),
            env=env, secrets=hidden, secrets_to="env", masks=self._secrets.values,
            lease_timeout=self.lease_timeout,
            grace_s=KILL_GRACE_S, show_hosts=False,  # poprun's lines as poprun prints them
            extra={"launch_host": launch_host, "argv": masked, "sweep": self._sweep})
        return handle

    def new_report(self) -> poprun_report.Tail:
        return poprun_report.Tail()

    def finish(self, context: Any, handle: JobHandle, report: poprun_report.Tail,
               finals: dict[str, dict[str, Any]]) -> dict[str, Any]:
        host = handle.extra.get("launch_host") or handle.parts[0].host
        final = finals.get(host, {})
        summary = dict(getattr(self, "_result", None) or self._summary_of(handle))
        self._sweep = self._sweep or handle.extra.get("sweep")
        if final.get("state") == "unreachable":  # the stream failed (cmd_timeout, link lost)
            cause = final.get("cause") or "the stream failed"
            if self._next_try_attaches and "(cmd_timeout)" not in cause:
                raise RingflowHostUnreachableException(self._secrets.mask(
                    f"{cause}; the job may still run on {host!r}: the next try attaches to "
                    f"it (or its lease stops it)"))
            said = self._stop_after_failure(handle, host)
            # cmd_timeout: the host answers, the job was silent for too long
            lost = (RingflowLaunchException if "(cmd_timeout)" in cause
                    else RingflowHostUnreachableException)
            raise lost(self._secrets.mask(f"{cause}; on {host!r}: {said}" if said else cause))
        exit_code = final.get("exit_code")
        self._sweep_segments(handle)
        self._check_exit(exit_code if isinstance(exit_code, int) else -1, list(report.lines),
                         host, final)
        summary["exit_code"] = exit_code
        summary["duration_s"] = poprun_report.duration_s(getattr(self, "_run_started", None),
                                                          final)
        self.log.info("PopRun job %s on %s succeeded after %.1f s", handle.task, host,
                      summary["duration_s"])
        return summary

    def _summary_of(self, handle: JobHandle) -> dict[str, Any]:
        """After a deferral the operator is new: the summary is made again from its
        arguments (as rendered for this run)."""
        return poprun_report.summary(self._config(), handle.extra.get("argv") or [],
                                     handle.extra.get("launch_host"), dry_run=False)

    def _sweep_segments(self, handle: JobHandle) -> None:
        """A ringflow job's shared memory that a crash left, removed on every host of it."""
        if self._sweep is None or self._killed:
            return
        python, job_id, hosts = self._sweep
        launcher = SSHLauncher(hosts, log=self.log, python=python,
                               conns={h: self.ssh_conn_id for h in hosts},
                               conn_timeout=self.conn_timeout)
        try:
            said = launcher.sweep_shm(job_id, commands.Runtime(python, handle.pythonpath))
        finally:
            launcher.close()
        for host in hosts:
            self.log.info("shm sweep on %s: %s", host, said.get(host))

    def _check_exit(self, exit_code: int, tail: list[str], host: str,
                    final: dict[str, Any]) -> None:
        if self._killed:
            raise RingflowJobKilledException(
                f"PopRun job {self._handle.task if self._handle else ''} on {host!r} was "
                f"killed (on_kill)")
        poprun_report.check_exit(exit_code, tail, host, final, self.skip_on_exit_code,
                                 self._secrets.mask)

    def _stop_after_failure(self, handle: JobHandle, host: str) -> str:
        """A job outlives a failed stream (cmd_timeout, dropped link) and Airflow calls no
        on_kill after an exception: stop it here. Returns what the host said."""
        if self._launcher is None:
            return ""
        said = self._launcher.stop(handle, "after the failure", timeout=self.conn_timeout)
        text = said.get(host, "")
        if text:
            self.log.info("after the failure on %s: %s", host, text)
        return text
