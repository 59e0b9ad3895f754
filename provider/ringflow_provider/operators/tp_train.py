"""TPTrainOperator: tensor-parallel + data-parallel training with ringflow's runtime, on this
host or on several over SSH or Open MPI.

The operator is thin: it validates the rendered job spec (``tp_train.spec``), picks a
launcher backend by name (`launchers`: ``local`` without hosts, else ``ssh`` or ``mpirun``),
starts one launcher agent per host under ringflow's supervisor running ``ringflow.train``
(or attaches to the previous try's job), watches it here or defers to the triggerer, and
turns what the job printed into progress lines, a summary (XCom), a plot and an Asset event.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets as token_source
import time
import uuid
from typing import Any, ClassVar

from airflow.sdk import Asset

from ringflow.errors import ConfigError, LaunchError
from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowHostUnreachableException,
    RingflowJobFailedException,
    RingflowJobRefusedException,
    launch_exception,
)
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.jobs import Secrets
from ringflow_provider.jobs.masking import split_env
from ringflow_provider.launchers import get_launcher
from ringflow_provider.launchers.base import Launcher
from ringflow_provider.launchers.job import JobHandle, TaskKey
from ringflow_provider.launchers.lines import JobLine
from ringflow_provider.launchers.local import ringflow_home
from ringflow_provider.operators.base import RingflowJobOperator
from ringflow_provider.plugins.links import TrainingCurveLink
from ringflow_provider.tp_train import outcome
from ringflow_provider.tp_train.args import DEFAULT_HEARTBEAT_TIMEOUT_S, env_dict
from ringflow_provider.tp_train.plan import (
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_FOLDER,
    DEFAULT_LOG_DIR,
    check_memory,
    folder_ids,
    job_plan,
    log_plan,
)
from ringflow_provider.tp_train.report import JobReport, Presenter
from ringflow_provider.tp_train.spec import SPEC_FIELDS

__all__ = ["DEFAULT_CHECKPOINT_DIR", "DEFAULT_LOG_DIR", "TPTrainOperator", "ringflow_home"]

_STOP_GRACE_S = 10.0  # the supervisor's SIGTERM -> SIGKILL; the agent's own grace is 5 s


class TPTrainOperator(RingflowJobOperator):
    """Train a ringflow model with tensor and data parallelism on this host's CPU.

    One launcher agent starts ``nproc_per_host`` worker processes (ranks); each runs the job
    spec below with ringflow's runtime. Model-parallel groups are ``tensor_parallel_degree``
    consecutive ranks; the rest is data parallel. Rank 0's metric lines become progress
    lines in the task log; the return value (XCom) is a summary; the loss curve goes to a PNG
    next to the logs and as a text chart at the end of the log; a successful run emits an
    event on the task's Asset ``ringflow://<dag_id>/<task_id>`` with the checkpoint (a debug
    run of ``airflow tasks test`` does not, so it triggers no DAG scheduled on the Asset).

    Job spec (each templated; dict fields also take JSON text):

    :param model: ``mlp``, ``transformer`` or ``package.module:build_fn`` (templated)
    :param model_args: arguments of the model builder (templated)
    :param data: ``synthetic``; the path of an ``.npz`` of arrays named as the feeds or a
        ``.csv`` of features and a label (the mlp); for the transformer a UTF-8 text file,
        a folder of them or an ``.npy`` token stream. Paths are read on each host
        (templated)
    :param tokenizer: text to tokens: ``byte`` (default, vocabulary 256) or ``char`` (the
        corpus's characters, stored with the checkpoint) (templated)
    :param validation_fraction: hold out this fraction of ``data`` for validation; 0
        (default): none (templated)
    :param eval_data: validation data of the kinds ``data`` takes; None: none (templated)
    :param eval_every: validate every this many steps, at each checkpoint and at the last,
        default 100; the validation loss goes into the progress lines and the summary
        (templated)
    :param optimizer: ``{"type": sgd|momentum|adam|adamw|lamb|lars, ...its arguments}``,
        default Adam with learning rate 1e-3 (templated)
    :param lr_schedule: None or ``{"type": cosine|step|linear_warmup, ...}`` (templated)
    :param grad_clip: global-norm clip, None for none (templated)
    :param steps: total training steps, counted across resumes, default 200 (templated)
    :param global_batch_size: samples per step over all data-parallel ranks, default 32
        (templated)
    :param seed: parameters, data order and dropout, default 0 (templated)
    :param tensor_parallel_degree: ranks that split each layer; divides nproc_per_host,
        default 1 (templated)
    :param dtype: ``float32`` (default) or ``float64`` (templated)
    :param log_every: a progress line every this many steps, default 10 (templated)
    :param checkpoint_dir: where checkpoints go; default
        ``~/.ringflow/checkpoints/<dag_id>/<run_id>/<task_id>`` (shared by the tries of a
        task, so a retry resumes); None: no checkpoints (templated). In both default
        folders ``$RINGFLOW_HOME``, if set, replaces ``~/.ringflow``.
    :param checkpoint_every: a checkpoint every this many steps and at the last, default 100
        (templated)
    :param resume: resume from the newest complete checkpoint, default True (templated)
    :param amp: automatic mixed precision (float16 matmuls, float32 master weights, dynamic
        loss scaling), default False (templated)
    :param recompute: recompute activations in the backward pass: True for the model's
        natural checkpoints (each block's output), or a list of checkpoint variable names;
        default False (templated)
    :param sharding_stage: shard the optimizer state (1) and the gradients too (2) over the
        data-parallel ranks (fleet's sharding, ZeRO stages 1 and 2); 0 (default): every
        data-parallel rank holds all of it (templated)
    :param gradient_accumulation_steps: micro-batches per step: each rank runs its share of
        the global batch in this many parts and the optimizer applies their mean gradient
        once (fleet's gradient_merge); default 1 (templated)

    How it runs:

    :param nproc_per_host: ranks on this host, default 2 (templated)
    :param log_dir: each rank's log ``workerlog.<rank>``, the spec and the plot; default
        ``~/.ringflow/runs/<dag_id>/<run_id>/<task_id>/try-<n>`` (templated)
    :param extra_env: variables for every rank; those under secret-looking names (see
        ``jobs.masking``: secret, password, token, key, ...) travel as ``secret_env`` does
        and are masked. Variables that load code into every rank (``LD_*``, ``PYTHON*``,
        ``BASH_ENV``, ``ENV``, ``PATH``, ``OMPI_MCA_*`` of an agent or output parameter,
        ...) are refused unless ``allow_unsafe_env`` (templated)
    :param secret_env: variables for every rank whose values are always secret: they reach
        the ranks over the launcher's stdin, never a command line, and are masked everywhere;
        the names extra_env refuses are refused here too (templated)
    :param allow_unsafe_env: take the variables extra_env and secret_env refuse by default;
        default False. Not templated and not offered by a trigger form
        (``tp_train.form``): only the DAG's author decides
    :param memory_check: before the ranks start, refuse a job whose estimated memory per
        host (parameters, gradients, optimizer state and activations of each rank, from the
        built model) exceeds a host's MemAvailable; default True (templated)

    On this host (no ``hosts``) the ranks start from a minimal environment: ``PATH``,
    ``HOME``, ``LANG``, ``LC_*``, ``TMPDIR`` and ``RINGFLOW_*`` of the worker's, then the
    launcher's variables, ``extra_env`` and ``secret_env``; never the worker's Airflow
    settings or connections. A ``package.module:build_fn`` model is imported and built on
    the Airflow side first (with ``extra_env``'s ``PYTHONPATH``), so a builder that does
    not exist or returns no model fails the task before anything starts.

    On several hosts (``hosts`` set; each host needs only python3 and numpy):

    :param hosts: train on these hosts over SSH instead of this one: a list or a comma
        string of hostnames or IPv4 addresses, ranks host-major, ``nproc_per_host`` on each;
        None (default): this host (templated)
    :param ssh_conn_id: the ``ssh`` connection that reaches the hosts (its host replaced by
        each), or a mapping host -> connection id; default ``ssh_default`` (templated)
    :param python: the interpreter on the hosts, default ``python3`` (templated)
    :param launcher: ``ssh``: one ringflow launcher agent per host over SSH (default);
        ``mpirun``: Open MPI's mpirun on the first host starts one agent per host (needs
        Open MPI on every host and SSH from the first host to the others) (templated)
    :param base_port: the first rank port on every host; default a range free on every
        host, found before the job starts (templated)
    :param heartbeat_timeout: seconds of silence after which a rank declares a peer lost
        (its process stopped, or its host unreachable), default 20; a network hiccup
        shorter than this does not stop the job, and a lost host fails the task within
        about twice this (templated)
    :param ship_data: copy ``data`` and ``eval_data`` from this worker to every host over
        SFTP (into ``~/.ringflow/data/<sha256>/``, checked by its digest there and reused by
        later jobs) instead of reading the paths on each host; default False

    How it is watched (the job runs under ringflow's supervisor on each host, detached from
    the task process; see `RingflowJobOperator`):

    :param deferrable: hand the watch to Airflow's triggerer, freeing the worker slot while
        the job trains; default ``[operators] default_deferrable`` (False)
    :param poll_interval: seconds between the triggerer's looks, default 10
    :param lease_timeout: seconds the job trains on without a watcher before it stops itself,
        default 1800; None: never
    :param on_existing: ``reattach`` (default): a new try whose previous try's job still runs
        watches that job to its end; ``restart``: it stops that job and resumes from the
        newest checkpoint. In attached mode the job stops within seconds when the task
        process dies, unless a later try could attach to it (``reattach`` and retries left)
    """

    template_fields = (*SPEC_FIELDS, "nproc_per_host", "log_dir", "extra_env", "secret_env",
                       "memory_check", "hosts", "ssh_conn_id", "python", "launcher", "base_port",
                       "heartbeat_timeout", *RingflowJobOperator.job_fields)
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "model_args": "json", "optimizer": "json", "lr_schedule": "json", "extra_env": "json",
        "secret_env": "json"}
    template_ext = ()
    ui_color = "#d8f0d2"
    #: the task instance's "Training" tab in the UI (the plugin's pages)
    operator_extra_links = (TrainingCurveLink(),)
    presenter = "tp_train"

    def __init__(self, *, model: str = "transformer", model_args: dict | str | None = None,
                 data: str = "synthetic", tokenizer: str = "byte",
                 validation_fraction: float | str = 0.0, eval_data: str | None = None,
                 eval_every: int | str = 100, optimizer: dict | str | None = None,
                 lr_schedule: dict | str | None = None, grad_clip: float | str | None = None,
                 steps: int | str = 200, global_batch_size: int | str = 32,
                 seed: int | str = 0, tensor_parallel_degree: int | str = 1,
                 dtype: str = "float32", log_every: int | str = 10,
                 checkpoint_dir: str | None = DEFAULT_FOLDER, checkpoint_every: int | str = 100,
                 resume: bool | str = True, amp: bool | str = False,
                 recompute: bool | list[str] | str = False,
                 sharding_stage: int | str = 0,
                 gradient_accumulation_steps: int | str = 1, nproc_per_host: int | str = 2,
                 log_dir: str | None = None, extra_env: dict | str | None = None,
                 secret_env: dict | str | None = None, memory_check: bool | str = True,
                 hosts: list[str] | str | None = None,
                 ssh_conn_id: str | dict = MultiHostSSHHook.default_conn_name,
                 python: str = "python3", launcher: str = "ssh",
                 base_port: int | str | None = None, allow_unsafe_env: bool = False,
                 heartbeat_timeout: float | str = DEFAULT_HEARTBEAT_TIMEOUT_S,
                 ship_data: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(allow_unsafe_env, bool):  # a template must not switch it on
            raise RingflowConfigException(f"task {self.task_id!r}: allow_unsafe_env: expected "
                                          f"True or False (not templated), got "
                                          f"{allow_unsafe_env!r}")
        self.allow_unsafe_env = allow_unsafe_env
        self.ship_data = bool(ship_data)
        self.model, self.model_args, self.data = model, model_args or {}, data
        self.tokenizer, self.validation_fraction = tokenizer, validation_fraction
        self.eval_data, self.eval_every = eval_data, eval_every
        self.optimizer = optimizer if optimizer is not None else {"type": "adam",
                                                                   "learning_rate": 1e-3}
        self.lr_schedule, self.grad_clip, self.steps = lr_schedule, grad_clip, steps
        self.global_batch_size, self.seed = global_batch_size, seed
        self.tensor_parallel_degree, self.dtype, self.log_every = (
            tensor_parallel_degree, dtype, log_every)
        self.checkpoint_dir, self.checkpoint_every, self.resume = (
            checkpoint_dir, checkpoint_every, resume)
        self.amp, self.recompute, self.sharding_stage = amp, recompute, sharding_stage
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.nproc_per_host, self.log_dir = nproc_per_host, log_dir
        self.extra_env, self.secret_env = extra_env or {}, secret_env or {}
        self.memory_check = memory_check
        self.hosts, self.ssh_conn_id, self.python = hosts, ssh_conn_id, python
        self.launcher, self.base_port = launcher, base_port
        self.heartbeat_timeout = heartbeat_timeout
        self._declare_asset()
        self._steps = 0

    def _declare_asset(self) -> None:
        """The task's outlet Asset, fixed when the DAG is parsed (needs the DAG)."""
        if not self.outlets and self.has_dag():
            self.outlets = [Asset(f"ringflow://{self.dag_id}/{self.task_id}")]

    @property
    def asset(self) -> Asset | None:
        return next((o for o in self.outlets if isinstance(o, Asset)
                     and o.uri.startswith("ringflow://")), None)

    # validation -------------------------------------------------------------------------------
    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render, then register secret values with Airflow's masker at once, so the
        rendered fields Airflow stores and shows are masked too."""
        super().render_template_fields(context, jinja_env)
        self._secrets = self._collect_secrets()
        self._secrets.register()

    def _collect_secrets(self) -> Secrets:
        found = Secrets()
        for env, all_secret in ((self.extra_env, False), (self.secret_env, True)):
            with contextlib.suppress(ValueError):  # reported by _plan, masked as known
                found.add_env(env_dict(env, "env"), all_secret=all_secret)
        return found

    def _plan(self, context: Any) -> dict[str, Any]:
        """The rendered arguments, validated into the job's plan (`tp_train.plan.job_plan`).
        A bad value fails the task at once, without retries, naming field and value."""
        ids = folder_ids(TaskKey.from_ti(context["ti"]))
        try:
            return job_plan(self, ids)
        except Exception as exc:  # validation messages quote values: mask them
            raise RingflowConfigException(
                self._secrets.mask(f"task {self.task_id!r}: {exc}")) from None

    # running ----------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        plan = self._plan(context)
        self._steps = plan["spec"].steps
        launcher = get_launcher(plan["launcher"], plan["hosts"], log=self.log,
                                python=plan["python"], conns=plan["conns"] or None)
        hosts = plan["hosts"]
        where = f" on {len(hosts)} hosts" if hosts else ""
        try:
            return self.run_job(context, launcher, lambda: self._start(context, launcher, plan),
                                where)
        except LaunchError as exc:
            raise launch_exception(exc, self._secrets.mask(str(exc))) from None
        finally:
            launcher.close()

    def _start(self, context: Any, launcher: Launcher, plan: dict[str, Any]) -> JobHandle:
        """Prepare the hosts, stop what earlier tries left, start one agent per host."""
        spec, nproc = plan["spec"], plan["nproc"]
        task = TaskKey.from_ti(context["ti"])
        log_plan(self.log, plan, task)
        # a job that cannot fit is refused before any folder is made on a host
        self._check_memory(launcher, plan)
        launcher.prepare(numpy=True, writable={"log_dir": plan["log_dir"],
                                               "checkpoint_dir": spec.checkpoint_dir})
        if self.ship_data and plan["hosts"]:
            from ringflow_provider.launchers.data import ship_job_data

            spec = plan["spec"] = ship_job_data(launcher, spec, self.log)
        launcher.stop_earlier(task, f"try {task.try_number} starts the job again")
        self._raise_if_killed()
        port = plan["base_port"] or launcher.free_base_port(nproc)
        log_dir = plan["log_dir"]
        text = json.dumps(spec.to_dict(), indent=2) + "\n"
        launcher.on_every_host(lambda h: launcher.put_file(h, f"{log_dir}/spec.json", text),
                               "writing the job spec")
        token = token_source.token_hex(32)
        self._secrets = self._collect_secrets().add(token)
        self._secrets.register()
        # extra_env under secret names goes as secret_env does: on stdin, never on a command
        # line (`ps` on a host); the rest as quoted exports
        plain, hidden = split_env(plan["extra"])
        env = {**plain, "PYTHONUNBUFFERED": "1",
               "RINGFLOW_HEARTBEAT_TIMEOUT": f"{plan['heartbeat']:g}"}
        parts = launcher.agent_parts(["-m", "ringflow.train", f"{log_dir}/spec.json"],
                                     nproc_per_host=nproc, log_dir=log_dir, base_port=port,
                                     env=env)
        return launcher.start(
            task, parts, job_id=uuid.uuid4().hex[:12], env=env,
            secrets={"RINGFLOW_JOB_TOKEN": token, **hidden, **plan["secret"]},
            masks=self._secrets.values,
            lease_timeout=self.lease_timeout, grace_s=_STOP_GRACE_S, log_dir=log_dir,
            checkpoint_dir=spec.checkpoint_dir, gathered=launcher.name == "mpirun",
            extra={"homes": dict(launcher.homes), "nproc_per_host": nproc,
                   "model": spec.model, "mp_degree": spec.tensor_parallel_degree,
                   "steps": spec.steps, "heartbeat_timeout": plan["heartbeat"]})

    def _check_memory(self, launcher: Launcher, plan: dict[str, Any]) -> None:
        """Every host's MemAvailable holds its ranks' estimate, or the job is refused."""
        try:
            check_memory(launcher, plan, self.log)
        except ConfigError as exc:
            raise RingflowConfigException(f"task {self.task_id!r}: {exc}") from None

    # the job's lines ----------------------------------------------------------------------------
    def new_report(self) -> JobReport:
        return JobReport()

    def present(self, line: JobLine) -> tuple[str, str]:
        if not hasattr(self, "_presenter"):
            self._presenter = Presenter(self._steps)
        return self._presenter(line)

    def present_options(self) -> dict[str, Any]:
        return {"steps": self._steps}

    def progress_text(self, report: JobReport) -> str:
        step = report.last_step
        return f"step {step}/{self._steps}" if step is not None else ""

    # the end ------------------------------------------------------------------------------------
    def finish(self, context: Any, handle: JobHandle, report: JobReport,
               finals: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The summary (XCom), the plot and the Asset event of a job that succeeded; the
        failure of one that did not: the same whether it was watched here or deferred."""
        if outcome.failed(finals):
            failed = outcome.failure(handle, report, finals)
            message = self._secrets.mask(failed.message)
            if failed.unreachable:
                raise RingflowHostUnreachableException(message)
            if not failed.retry_helps:
                raise RingflowJobRefusedException(
                    f"{message}\n(not retried: {outcome.NO_RETRY[failed.exit_code]})",
                    failed.exit_code, failed.host)
            raise RingflowJobFailedException(message, failed.exit_code, failed.host)
        summary, messages = outcome.summarize(handle, report, self.task_id)
        for message in messages:
            self.log.info("%s", message)
        self.log.info("training finished %.1f s after the job started%s: final loss %s",
                      time.time() - handle.started_at,
                      f" on {len(handle.hosts)} hosts" if handle.show_hosts else "",
                      json.dumps(summary["final_loss"]))
        asset, events = self.asset, context.get("outlet_events")
        if asset is not None and debug_run(context):
            # Airflow records an event for every outlet of a task that succeeds, so a debug
            # run drops the outlet: its model must not trigger the DAGs scheduled on it.
            self.outlets = [o for o in self.outlets if o is not asset]
            self.log.info("no event on the Asset %s: this is a debug run (airflow tasks "
                          "test), which does not trigger the DAGs scheduled on it", asset.uri)
        elif asset is not None and events is not None:
            host = handle.hosts[0] if handle.show_hosts else os.uname().nodename
            events[asset].extra = {"checkpoint": summary["checkpoint"], "host": host,
                                   "step": summary["steps"],
                                   "final_loss": summary["final_loss"],
                                   **{k: summary[k] for k in ("val_loss", "best_checkpoint")
                                      if k in summary}}
        return summary


#: `airflow tasks test` runs a task in a DAG run of this id (deleted afterwards) and sets
#: AIRFLOW_TEST_MODE, also when it reuses a run named on its command line
DEBUG_RUN_PREFIX = "__airflow_temporary_run_"


def debug_run(context: Any) -> bool:
    """Whether the task runs under `airflow tasks test` rather than in a DAG run."""
    run_id = context.get("run_id") or getattr(context.get("ti"), "run_id", None) or ""
    return (str(run_id).startswith(DEBUG_RUN_PREFIX)
            or os.environ.get("AIRFLOW_TEST_MODE", "").lower() == "true")

