"""TPTrainOperator: tensor-parallel + data-parallel training with ringflow on this host.

The operator is thin: it validates the rendered job spec (``tp_train.parse_spec``), starts
this host's launcher agent running ``ringflow.train`` as a ``LocalJob`` (its own process
group, tied to the task process by its stdin: the secrets come on it, and its end stops the
ranks), turns the job's lines into progress lines, and returns a summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets as token_source
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.errors import LaunchError
from ringflow.launch.stdin import encode_secrets
from ringflow.train.checkpoint import latest_checkpoint
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.jobs import LocalJob, Secrets
from ringflow_provider.remote_job import JobId
from ringflow_provider.tp_train.args import (
    base_port,
    connections,
    env_dict,
    host_list,
    how,
    launcher_name,
    log_tail,
    positive_int,
    ringflow_home,
    try_number,
)
from ringflow_provider.tp_train.report import (
    JobReport,
    failure_cause,
    plot_loss,
    progress_line,
    text_chart,
)
from ringflow_provider.tp_train.spec import SPEC_FIELDS, parse_spec, path_part
from ringflow_provider.tp_train_hosts import MultiHostTraining, failure_message, tag_line

__all__ = ["DEFAULT_CHECKPOINT_DIR", "DEFAULT_LOG_DIR", "TPTrainOperator", "ringflow_home"]

# {home} is $RINGFLOW_HOME, else ~/.ringflow (ringflow_home())
DEFAULT_LOG_DIR = "{home}/runs/{dag_id}/{run_id}/{task_id}/try-{try_number}"
# shared by the tries of a task, so a retry resumes where the failed try left off
DEFAULT_CHECKPOINT_DIR = "{home}/checkpoints/{dag_id}/{run_id}/{task_id}"
# with hosts: relative to the SSH login's home on each host (the agents' working folder)
REMOTE_LOG_DIR = ".ringflow/runs/{dag_id}/{run_id}/{task_id}/try-{try_number}"
REMOTE_CHECKPOINT_DIR = ".ringflow/checkpoints/{dag_id}/{run_id}/{task_id}"
_DEFAULT = "default"
# exit codes of ringflow.train that a retry cannot fix: a bad spec (2), a NaN/inf loss (3)
_NO_RETRY = {2: "the job spec or checkpoint was refused", 3: "the loss became NaN or inf"}
_STOP_GRACE_S = 4.0  # SIGTERM -> SIGKILL; Airflow allows about 5 s after its SIGTERM


class TPTrainOperator(BaseOperator):
    """Train a ringflow model with tensor and data parallelism on this host's CPU.

    One launcher agent starts ``nproc_per_host`` worker processes (ranks); each runs the job
    spec below with ringflow's runtime. Model-parallel groups are ``tensor_parallel_degree``
    consecutive ranks; the rest is data parallel. Rank 0's metric lines become progress
    lines in the task log; the return value (XCom) is a summary; the loss curve goes to a PNG
    next to the logs and as a text chart at the end of the log; a successful run emits an
    event on the task's Asset ``ringflow://<dag_id>/<task_id>`` with the checkpoint.

    Job spec (each templated; dict fields also take JSON text):

    :param model: ``mlp``, ``transformer`` or ``package.module:build_fn`` (templated)
    :param model_args: arguments of the model builder (templated)
    :param data: ``synthetic`` or the path of an ``.npz`` of arrays named as the feeds
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

    How it runs:

    :param nproc_per_host: ranks on this host, default 2 (templated)
    :param log_dir: each rank's log ``workerlog.<rank>``, the spec and the plot; default
        ``~/.ringflow/runs/<dag_id>/<run_id>/<task_id>/try-<n>`` (templated)
    :param extra_env: variables for every rank; values under secret-looking names (secret,
        password, token, key, ...) are masked (templated)
    :param secret_env: variables for every rank whose values are always secret: they reach
        the ranks over the launcher's stdin, never a command line, and are masked everywhere
        (templated)

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
    """

    template_fields = (*SPEC_FIELDS, "nproc_per_host", "log_dir", "extra_env", "secret_env",
                       "hosts", "ssh_conn_id", "python", "launcher", "base_port")
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "model_args": "json", "optimizer": "json", "lr_schedule": "json", "extra_env": "json",
        "secret_env": "json"}
    template_ext = ()
    ui_color = "#d8f0d2"

    def __init__(self, *, model: str = "transformer", model_args: dict | str | None = None,
                 data: str = "synthetic", optimizer: dict | str | None = None,
                 lr_schedule: dict | str | None = None, grad_clip: float | str | None = None,
                 steps: int | str = 200, global_batch_size: int | str = 32,
                 seed: int | str = 0, tensor_parallel_degree: int | str = 1,
                 dtype: str = "float32", log_every: int | str = 10,
                 checkpoint_dir: str | None = _DEFAULT, checkpoint_every: int | str = 100,
                 resume: bool | str = True, amp: bool | str = False,
                 recompute: bool | list[str] | str = False, nproc_per_host: int | str = 2,
                 log_dir: str | None = None, extra_env: dict | str | None = None,
                 secret_env: dict | str | None = None, hosts: list[str] | str | None = None,
                 ssh_conn_id: str | dict = MultiHostSSHHook.default_conn_name,
                 python: str = "python3", launcher: str = "ssh",
                 base_port: int | str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("retries", 1)
        super().__init__(**kwargs)
        self.model, self.model_args, self.data = model, model_args or {}, data
        self.optimizer = optimizer if optimizer is not None else {"type": "adam",
                                                                   "learning_rate": 1e-3}
        self.lr_schedule, self.grad_clip, self.steps = lr_schedule, grad_clip, steps
        self.global_batch_size, self.seed = global_batch_size, seed
        self.tensor_parallel_degree, self.dtype, self.log_every = (
            tensor_parallel_degree, dtype, log_every)
        self.checkpoint_dir, self.checkpoint_every, self.resume = (
            checkpoint_dir, checkpoint_every, resume)
        self.amp, self.recompute = amp, recompute
        self.nproc_per_host, self.log_dir = nproc_per_host, log_dir
        self.extra_env, self.secret_env = extra_env or {}, secret_env or {}
        self.hosts, self.ssh_conn_id, self.python = hosts, ssh_conn_id, python
        self.launcher, self.base_port = launcher, base_port
        self._declare_asset()
        # Plain attributes, not threading objects: Airflow deep-copies operators.
        self._killed = False
        self._job: LocalJob | None = None
        self._training: MultiHostTraining | None = None
        self._secrets = Secrets()

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
        """The rendered arguments, validated (spec, nproc, log_dir, extra, secret; with
        hosts also hosts, conns, remote_log_dir, python, base_port). A bad value fails the
        task at once, without retries, naming field and value."""
        ti = context["ti"]
        ids = {"home": ringflow_home(), "dag_id": path_part(ti.dag_id),
               "run_id": path_part(ti.run_id), "task_id": path_part(ti.task_id),
               "try_number": try_number(ti)}
        try:
            hosts = host_list(self.hosts)
            values = {name: getattr(self, name) for name in SPEC_FIELDS}
            if values["checkpoint_dir"] == _DEFAULT:
                values["checkpoint_dir"] = (REMOTE_CHECKPOINT_DIR if hosts
                                            else DEFAULT_CHECKPOINT_DIR).format(**ids)
            if not hosts and isinstance(values["checkpoint_dir"], str) and \
                    values["checkpoint_dir"].strip():
                values["checkpoint_dir"] = os.path.expanduser(values["checkpoint_dir"].strip())
            spec = parse_spec(values)
            nproc = positive_int(self.nproc_per_host, "nproc_per_host")
            spec.check_layout(nproc * max(len(hosts), 1), nproc)
            local_dir = self.log_dir if self.log_dir and not hosts else DEFAULT_LOG_DIR
            plan = {"spec": spec, "nproc": nproc, "hosts": hosts,
                    "log_dir": Path(os.path.expanduser(local_dir.format(**ids))),
                    "extra": env_dict(self.extra_env, "extra_env"),
                    "secret": env_dict(self.secret_env, "secret_env")}
            if hosts:
                plan.update(conns=connections(self.ssh_conn_id, hosts),
                            remote_log_dir=(self.log_dir or REMOTE_LOG_DIR).format(**ids),
                            python=_interpreter(self.python), launcher=launcher_name(
                                self.launcher), base_port=base_port(self.base_port, nproc))
        except Exception as exc:  # validation messages quote values: mask them
            raise AirflowFailException(self._secrets.mask(f"task {self.task_id!r}: {exc}")) \
                from None
        return plan

    # running ----------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        plan = self._plan(context)
        if plan["hosts"]:
            return self._execute_on_hosts(context, plan)
        spec, nproc, log_dir = plan["spec"], plan["nproc"], plan["log_dir"]
        log_dir.mkdir(parents=True, exist_ok=True)
        spec_path = log_dir / "spec.json"
        spec_path.write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        self._log_plan(spec, nproc, log_dir, context)
        report = JobReport()
        started = time.monotonic()
        exit_code = self._run(spec, nproc, log_dir, spec_path, plan["extra"], plan["secret"],
                              report)
        self._raise_if_killed()
        if exit_code != 0:
            self._fail(exit_code, report, log_dir)
        summary = self._summary(spec, nproc, log_dir, report)
        self.log.info("training finished in %.1f s: %s", time.monotonic() - started,
                      json.dumps(summary["final_loss"]))
        self._emit_asset_event(context, summary, os.uname().nodename)
        return summary

    def _raise_if_killed(self) -> None:
        if self._killed:
            raise AirflowException(f"training job of task {self.task_id!r} was killed "
                                   f"(on_kill); its ranks were stopped")

    def _execute_on_hosts(self, context: Any, plan: dict[str, Any]) -> dict[str, Any]:
        spec, nproc, hosts, log_dir = plan["spec"], plan["nproc"], plan["hosts"], plan["log_dir"]
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        mp, world = spec.tensor_parallel_degree, nproc * len(hosts)
        self.log.info("training %s on %d hosts (%s), %d ranks each: %d ranks (tensor parallel "
                      "%d x data parallel %d), %d steps of %d samples; logs and spec in %s on "
                      "each host, checkpoints in %s", spec.model, len(hosts), ",".join(hosts),
                      nproc, world, mp, world // mp, spec.steps, spec.global_batch_size,
                      plan["remote_log_dir"], spec.checkpoint_dir)
        token = token_source.token_hex(32)
        self._secrets = self._collect_secrets().add(token)
        self._secrets.register()
        ti, report, first = context["ti"], JobReport(), {"step": None}
        hooks = {conn: MultiHostSSHHook(conn) for conn in set(plan["conns"].values())}

        def on_line(host: str, stream: str, text: str) -> None:
            self._on_line(stream, text, report, spec.steps, first, tag_line(host, text), host)

        training = self._training = MultiHostTraining(
            {h: hooks[c] for h, c in plan["conns"].items()}, hosts,
            JobId(ti.dag_id, ti.task_id, ti.run_id, try_number(ti)), plan["python"], nproc,
            plan["remote_log_dir"], on_line, self.log, plan["base_port"], plan["launcher"])
        started = time.monotonic()
        try:
            training.prepare(spec.to_dict())
            self._raise_if_killed()
            env = {**plan["extra"], "RINGFLOW_JOB_ID": uuid.uuid4().hex[:12],
                   "PYTHONUNBUFFERED": "1"}
            agents = training.run(env, encode_secrets({"RINGFLOW_JOB_TOKEN": token,
                                                       **plan["secret"]}).decode())
        except LaunchError as exc:
            raise AirflowException(self._secrets.mask(str(exc))) from None
        finally:
            for hook in hooks.values():
                hook.close()
        self._raise_if_killed()
        if any(a.exit_code != 0 for a in agents):
            message, code = failure_message(training)
            message = self._secrets.mask(message)
            if code in _NO_RETRY:
                raise AirflowFailException(f"{message}\n(not retried: {_NO_RETRY[code]})")
            raise AirflowException(message)
        summary = self._summary(spec, world, log_dir, report)
        summary.update(hosts=hosts, checkpoint=training.absolute(summary["checkpoint"]),
                       log_dir=f"{hosts[0]}:{training.absolute(plan['remote_log_dir'])}")
        self.log.info("training finished in %.1f s on %d hosts: %s",
                      time.monotonic() - started, len(hosts), json.dumps(summary["final_loss"]))
        self._emit_asset_event(context, summary, hosts[0])
        return summary

    def _log_plan(self, spec: Any, nproc: int, log_dir: Path, context: Any) -> None:
        mp = spec.tensor_parallel_degree
        self.log.info(
            "training %s on this host: %d ranks (tensor parallel %d x data parallel %d), %d "
            "steps of %d samples, %s, %s optimizer; logs and spec in %s", spec.model, nproc, mp,
            nproc // mp, spec.steps, spec.global_batch_size, spec.dtype,
            spec.optimizer["type"], log_dir)
        attempt = try_number(context["ti"])
        if spec.checkpoint_dir is None:
            self.log.info("no checkpoints (checkpoint_dir is None): a retry starts over")
            return
        latest = latest_checkpoint(spec.checkpoint_dir) if spec.resume else None
        if latest is None:
            self.log.info("try %d: no complete checkpoint in %s: training starts at step 1",
                          attempt, spec.checkpoint_dir)
        elif latest.step >= spec.steps:
            self.log.info("try %d: the checkpoint of step %d in %s already reaches the %d "
                          "steps asked: nothing to train", attempt, latest.step,
                          latest.path, spec.steps)
        else:
            self.log.info("try %d: resuming from step %d (checkpoint %s)", attempt,
                          latest.step, latest.path)

    def _run(self, spec: Any, nproc: int, log_dir: Path, spec_path: Path, extra_env: dict,
             secret_env: dict, report: JobReport) -> int:
        token = token_source.token_hex(32)
        self._secrets = self._collect_secrets().add(token)
        self._secrets.register()
        env = {**os.environ, **{k: str(v) for k, v in extra_env.items()},
               "RINGFLOW_JOB_ID": uuid.uuid4().hex[:12], "PYTHONUNBUFFERED": "1"}
        for name in ("RINGFLOW_JOB_TOKEN", *secret_env):
            env.pop(name, None)  # they come on stdin only
        line = encode_secrets({"RINGFLOW_JOB_TOKEN": token,
                               **{k: str(v) for k, v in secret_env.items()}})
        argv = [sys.executable, "-m", "ringflow.launch", "--stdin", "--nproc-per-host",
                str(nproc), "--log-dir", str(log_dir), "-m", "ringflow.train", str(spec_path)]
        first = {"step": None}

        def on_line(stream: str, text: str) -> None:
            self._on_line(stream, text, report, spec.steps, first)

        with LocalJob(argv, on_line, env=env, stdin_line=line, grace_s=_STOP_GRACE_S) as job:
            self._job = job
            if self._killed:
                return -1
            job.start()
            return job.wait()

    def _on_line(self, stream: str, text: str, report: JobReport, steps: int,
                 first: dict, shown: str | None = None, host: str | None = None) -> None:
        parsed = report.feed(text)
        if parsed is None:
            text = self._secrets.mask(shown if shown is not None else text)
            (self.log.info if stream == "stdout" else self.log.warning)("%s", text)
            return
        kind, payload = parsed
        if kind == "metric":
            first["step"] = first["step"] or payload["step"]
            self.log.info("%s", progress_line(payload, steps, first["step"]))
        elif kind == "summary":
            self.log.info("summary: %s", self._secrets.mask(json.dumps(payload)))
        else:
            self.log.info("launcher%s: %s (exit code %s)", f" on {host}" if host else "",
                          payload.get("cause"), payload.get("exit_code"))

    def _fail(self, exit_code: int, report: JobReport, log_dir: Path) -> None:
        result = report.result or {}
        rank = result.get("failed_rank")
        if rank is None:  # the launcher itself failed (or gave no result line)
            tail = self._job.tail if self._job else []
            where = (f"the launcher on this host ended with {how(exit_code)} "
                     f"({result.get('cause') or 'no result line'})")
            source = "its output"
        else:
            tail = log_tail(log_dir, rank)
            info = next((r for r in result.get("ranks", []) if r.get("rank") == rank), {})
            code = info.get("exit_code", exit_code)
            cause = failure_cause(tail) or result.get("cause") or "no cause in its log"
            where = (f"rank {rank} on {result.get('host', 'this host')} (pid "
                     f"{info.get('pid', '?')}) failed first with {how(code)}: {cause}")
            source = str(log_dir / f"workerlog.{rank}")
            exit_code = code
        message = self._secrets.mask(f"training failed: {where}; last {len(tail)} lines of "
                                     f"{source}:\n" + "\n".join(tail))
        if exit_code in _NO_RETRY:
            raise AirflowFailException(f"{message}\n(not retried: {_NO_RETRY[exit_code]})")
        raise AirflowException(message)

    def _summary(self, spec: Any, world: int, log_dir: Path, report: JobReport
                 ) -> dict[str, Any]:
        job = report.summary or {}
        mp, nproc = spec.tensor_parallel_degree, world
        plot, said = plot_loss(report.history, log_dir / "loss.png",
                               f"{self.task_id}: {spec.model}, mp {mp} x dp {nproc // mp}")
        self.log.info("%s", said)
        chart = text_chart(report.history)
        if chart:
            self.log.info("loss by step:\n%s", chart)
        return {"final_loss": job.get("final_loss"),
                "loss_history": [[s, v] for s, v in report.history],
                "samples_per_s": job.get("samples_per_s"), "steps": job.get("steps"),
                "world_size": nproc, "mp_degree": mp, "dp_degree": nproc // mp,
                "checkpoint": job.get("checkpoint"), "log_dir": str(log_dir), "plot": plot,
                "resumed_from": job.get("resumed_from")}

    def _emit_asset_event(self, context: Any, summary: dict[str, Any], host: str) -> None:
        asset, events = self.asset, context.get("outlet_events")
        if asset is None or events is None:
            return
        events[asset].extra = {"checkpoint": summary["checkpoint"], "host": host,
                               "step": summary["steps"], "final_loss": summary["final_loss"]}

    def on_kill(self) -> None:
        """Stop every rank (TERM, KILL after a grace, without blocking Airflow's kill
        window) and make ``execute`` raise."""
        self._killed = True
        if self._job is not None:
            self.log.info("on_kill: %s", self._job.stop())
        if self._training is not None:
            self._training.stop("on_kill")


def _interpreter(value: Any) -> str:
    """The hosts' python: a command or a path, never something an option parser reads."""
    text = str(value or "").strip()
    if not text or text.startswith("-") or any(ord(c) < 32 for c in text):
        raise ValueError(f"python must be an interpreter's name or path, got {value!r}")
    return text
