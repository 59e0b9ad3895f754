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
import signal
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.launch.stdin import encode_secrets
from ringflow.train.checkpoint import latest_checkpoint
from ringflow_provider.jobs import LocalJob, Secrets
from ringflow_provider.tp_train import (
    SPEC_FIELDS,
    JobReport,
    failure_cause,
    json_text,
    launcher_argv,
    parse_spec,
    path_part,
    plot_loss,
    progress_line,
    text_chart,
)

__all__ = ["DEFAULT_CHECKPOINT_DIR", "DEFAULT_LOG_DIR", "TPTrainOperator", "ringflow_home"]

# {home} is $RINGFLOW_HOME, else ~/.ringflow (ringflow_home())
DEFAULT_LOG_DIR = "{home}/runs/{dag_id}/{run_id}/{task_id}/try-{try_number}"
# shared by the tries of a task, so a retry resumes where the failed try left off
DEFAULT_CHECKPOINT_DIR = "{home}/checkpoints/{dag_id}/{run_id}/{task_id}"
_DEFAULT = "default"
# exit codes of ringflow.train that a retry cannot fix: a bad spec (2), a NaN/inf loss (3)
_NO_RETRY = {2: "the job spec or checkpoint was refused", 3: "the loss became NaN or inf"}
_STOP_GRACE_S = 4.0  # SIGTERM -> SIGKILL; Airflow allows about 5 s after its SIGTERM


def _how(exit_code: int) -> str:
    """``exit code 137 (128+9: SIGKILL)``, as a shell reports a process a signal ended."""
    if 128 < exit_code <= 128 + 64:
        try:
            name = signal.Signals(exit_code - 128).name
        except ValueError:
            name = f"signal {exit_code - 128}"
        return f"exit code {exit_code} (128+{exit_code - 128}: {name})"
    return f"exit code {exit_code}"


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
    """

    template_fields = (*SPEC_FIELDS, "nproc_per_host", "log_dir", "extra_env", "secret_env")
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
                 secret_env: dict | str | None = None, **kwargs: Any) -> None:
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
        self._declare_asset()
        # Plain attributes, not threading objects: Airflow deep-copies operators.
        self._killed = False
        self._job: LocalJob | None = None
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
                found.add_env(_env_dict(env, "env"), all_secret=all_secret)
        return found

    def _plan(self, context: Any) -> tuple[Any, int, Path, dict, dict]:
        """The rendered arguments, validated: (spec, nproc, log dir, extra env, secret env).
        A bad value fails the task at once, without retries, naming field and value."""
        ti = context["ti"]
        ids = {"home": ringflow_home(), "dag_id": path_part(ti.dag_id),
               "run_id": path_part(ti.run_id), "task_id": path_part(ti.task_id),
               "try_number": _try_number(ti)}
        try:
            values = {name: getattr(self, name) for name in SPEC_FIELDS}
            if values["checkpoint_dir"] == _DEFAULT:
                values["checkpoint_dir"] = DEFAULT_CHECKPOINT_DIR.format(**ids)
            if isinstance(values["checkpoint_dir"], str) and values["checkpoint_dir"].strip():
                values["checkpoint_dir"] = os.path.expanduser(values["checkpoint_dir"].strip())
            spec = parse_spec(values)
            nproc = _positive_int(self.nproc_per_host, "nproc_per_host")
            spec.check_layout(nproc, nproc)
            log_dir = Path(os.path.expanduser(self.log_dir or DEFAULT_LOG_DIR.format(**ids)))
            extra = _env_dict(self.extra_env, "extra_env")
            secret = _env_dict(self.secret_env, "secret_env")
        except Exception as exc:  # validation messages quote values: mask them
            raise AirflowFailException(self._secrets.mask(f"task {self.task_id!r}: {exc}")) \
                from None
        return spec, nproc, log_dir, extra, secret

    # running ----------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        spec, nproc, log_dir, extra_env, secret_env = self._plan(context)
        log_dir.mkdir(parents=True, exist_ok=True)
        spec_path = log_dir / "spec.json"
        spec_path.write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        self._log_plan(spec, nproc, log_dir, context)
        report = JobReport()
        started = time.monotonic()
        exit_code = self._run(spec, nproc, log_dir, spec_path, extra_env, secret_env, report)
        if self._killed:
            raise AirflowException(f"training job of task {self.task_id!r} was killed "
                                   f"(on_kill); its ranks were stopped")
        if exit_code != 0:
            self._fail(exit_code, report, log_dir)
        summary = self._summary(spec, nproc, log_dir, report)
        self.log.info("training finished in %.1f s: %s", time.monotonic() - started,
                      json.dumps(summary["final_loss"]))
        self._emit_asset_event(context, summary)
        return summary

    def _log_plan(self, spec: Any, nproc: int, log_dir: Path, context: Any) -> None:
        mp = spec.tensor_parallel_degree
        self.log.info(
            "training %s on this host: %d ranks (tensor parallel %d x data parallel %d), %d "
            "steps of %d samples, %s, %s optimizer; logs and spec in %s", spec.model, nproc, mp,
            nproc // mp, spec.steps, spec.global_batch_size, spec.dtype,
            spec.optimizer["type"], log_dir)
        try_number = _try_number(context["ti"])
        if spec.checkpoint_dir is None:
            self.log.info("no checkpoints (checkpoint_dir is None): a retry starts over")
            return
        latest = latest_checkpoint(spec.checkpoint_dir) if spec.resume else None
        if latest is None:
            self.log.info("try %d: no complete checkpoint in %s: training starts at step 1",
                          try_number, spec.checkpoint_dir)
        elif latest.step >= spec.steps:
            self.log.info("try %d: the checkpoint of step %d in %s already reaches the %d "
                          "steps asked: nothing to train", try_number, latest.step,
                          latest.path, spec.steps)
        else:
            self.log.info("try %d: resuming from step %d (checkpoint %s)", try_number,
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
        argv = launcher_argv(nproc, str(log_dir), str(spec_path))
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
                 first: dict) -> None:
        parsed = report.feed(text)
        if parsed is None:
            text = self._secrets.mask(text)
            (self.log.info if stream == "stdout" else self.log.warning)("%s", text)
            return
        kind, payload = parsed
        if kind == "metric":
            first["step"] = first["step"] or payload["step"]
            self.log.info("%s", progress_line(payload, steps, first["step"]))
        elif kind == "summary":
            self.log.info("summary: %s", self._secrets.mask(json.dumps(payload)))
        else:
            self.log.info("launcher: %s (exit code %s)", payload.get("cause"),
                          payload.get("exit_code"))

    def _fail(self, exit_code: int, report: JobReport, log_dir: Path) -> None:
        result = report.result or {}
        rank = result.get("failed_rank")
        if rank is None:  # the launcher itself failed (or gave no result line)
            tail = self._job.tail if self._job else []
            where = (f"the launcher on this host ended with {_how(exit_code)} "
                     f"({result.get('cause') or 'no result line'})")
            source = "its output"
        else:
            tail = _log_tail(log_dir, rank)
            info = next((r for r in result.get("ranks", []) if r.get("rank") == rank), {})
            code = info.get("exit_code", exit_code)
            cause = failure_cause(tail) or result.get("cause") or "no cause in its log"
            where = (f"rank {rank} on {result.get('host', 'this host')} (pid "
                     f"{info.get('pid', '?')}) failed first with {_how(code)}: {cause}")
            source = str(log_dir / f"workerlog.{rank}")
            exit_code = code
        message = self._secrets.mask(f"training failed: {where}; last {len(tail)} lines of "
                                     f"{source}:\n" + "\n".join(tail))
        if exit_code in _NO_RETRY:
            raise AirflowFailException(f"{message}\n(not retried: {_NO_RETRY[exit_code]})")
        raise AirflowException(message)

    def _summary(self, spec: Any, nproc: int, log_dir: Path, report: JobReport
                 ) -> dict[str, Any]:
        job = report.summary or {}
        mp = spec.tensor_parallel_degree
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

    def _emit_asset_event(self, context: Any, summary: dict[str, Any]) -> None:
        asset, events = self.asset, context.get("outlet_events")
        if asset is None or events is None:
            return
        events[asset].extra = {"checkpoint": summary["checkpoint"], "host": os.uname().nodename,
                               "step": summary["steps"], "final_loss": summary["final_loss"]}

    def on_kill(self) -> None:
        """Stop every rank (TERM, KILL after a grace, without blocking Airflow's kill
        window) and make ``execute`` raise."""
        self._killed = True
        if self._job is not None:
            self.log.info("on_kill: %s", self._job.stop())


def ringflow_home() -> str:
    """The folder of the default log and checkpoint folders on this host: $RINGFLOW_HOME,
    else ~/.ringflow."""
    return os.path.expanduser(os.environ.get("RINGFLOW_HOME") or "~/.ringflow")


def _try_number(ti: Any) -> int:
    """The try as a person counts it: `airflow tasks test` runs a task as try 0."""
    return max(int(ti.try_number or 0), 1)


def _positive_int(value: Any, name: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return number


def _env_dict(value: Any, name: str) -> dict[str, str]:
    value = json_text(value) if isinstance(value, str) and value.strip() else (value or {})
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name} must be a mapping of variable names to values")
    for key in value:
        if not key.isidentifier() or key.startswith(("PADDLE_", "RINGFLOW_")):
            raise ValueError(f"{name}: {key!r} is not a variable a job may set (names are "
                             f"identifiers; PADDLE_* and RINGFLOW_* belong to the launcher)")
    return {k: str(v) for k, v in value.items()}


def _log_tail(log_dir: Path, rank: int, lines: int = 20) -> list[str]:
    path = log_dir / f"workerlog.{rank}"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 64 * 1024, 0))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror})"]
    return text.splitlines()[-lines:]
