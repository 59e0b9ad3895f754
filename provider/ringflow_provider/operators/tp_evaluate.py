"""TPEvaluateOperator: a model gate for a DAG scheduled on a training Asset. It evaluates a
ringflow checkpoint (``ringflow evaluate``), optionally samples text from it (``ringflow
generate``), on this worker or on a host over SSH, returns the metrics in XCom and fails
the task when a metric misses its threshold."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from airflow.sdk import BaseOperator

from ringflow.errors import LaunchError
from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowJobFailedException,
    RingflowJobRefusedException,
    RingflowMetricGateException,
    launch_exception,
)
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.tp_train import evaluate as ev


class TPEvaluateOperator(BaseOperator):
    """Evaluate a checkpoint that TPTrainOperator wrote, and gate on its metrics.

    Runs ``python -m ringflow.evaluate CHECKPOINT [--data PATH]`` (one process; a checkpoint
    of any layout, its tensor-parallel shards put together) and, with a ``prompt``, ``python
    -m ringflow.generate``; returns ``{"val_loss", "perplexity" (a language model) or
    "accuracy" (a classifier), "checkpoint", "step", "samples", "prompt", "generated"}``
    (XCom: the generated text follows the prompt). The text goes to the task log too.

    :param checkpoint: a checkpoint step folder or a checkpoint_dir (its newest complete
        checkpoint); a DAG scheduled on the training Asset finds it in the event's extra
        (``checkpoint``, and ``best_checkpoint`` with validation) (templated)
    :param data: the data to evaluate on; None (default): the training job's own validation
        data (templated)
    :param batch_size: samples per forward pass; default the job's global batch (templated)
    :param prompt: generate text from this prompt; None (default): no generation (templated)
    :param max_new_tokens: tokens to generate, default 200 (templated)
    :param temperature: sampling temperature, 0 = always the most likely token; default 0.8
        (templated)
    :param top_k: sample among the K most likely tokens; None: all (templated)
    :param seed: the sampling seed (the same seed, the same text), default 0 (templated)
    :param fail_if: the gate: ``{"val_loss": {"gt": 2.0}}`` fails the task when val_loss >
        2.0; comparisons ``gt``, ``ge``, ``lt``, ``le``; a metric the result lacks fails
        too. Not retried (templated)
    :param host: run on this host over SSH (the checkpoint path is read there; the runtime
        is shipped to it as for training); None (default): this worker (templated)
    :param ssh_conn_id: the ``ssh`` connection that reaches ``host``, default
        ``ssh_default`` (templated)
    :param python: the interpreter on ``host``, default ``python3`` (templated)
    :param timeout: seconds each command may take, default 3600
    """

    template_fields = ("checkpoint", "data", "batch_size", "prompt", "max_new_tokens",
                       "temperature", "top_k", "seed", "fail_if", "host", "ssh_conn_id",
                       "python")
    template_fields_renderers = {"fail_if": "json"}  # noqa: RUF012 (Airflow's own type)
    ui_color = "#e8f0d2"

    def __init__(self, *, checkpoint: str, data: str | None = None,
                 batch_size: int | str | None = None, prompt: str | None = None,
                 max_new_tokens: int | str = 200, temperature: float | str = 0.8,
                 top_k: int | str | None = None, seed: int | str = 0,
                 fail_if: dict | str | None = None, host: str | None = None,
                 ssh_conn_id: str = MultiHostSSHHook.default_conn_name,
                 python: str = "python3", timeout: float = 3600.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoint, self.data, self.batch_size = checkpoint, data, batch_size
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.fail_if = fail_if or {}
        self.host, self.ssh_conn_id, self.python = host, ssh_conn_id, python
        self.timeout = float(timeout)

    def execute(self, context: Any) -> dict[str, Any]:
        args = self._args()
        hook = None if args.host is None else MultiHostSSHHook(ssh_conn_id=args.ssh_conn_id)
        try:
            result = self._evaluate(args, self._runner(args, hook))
        finally:
            if hook is not None:
                hook.close()
        failed = ev.gate_failures(args.fail_if, result)
        if failed:
            raise RingflowMetricGateException(
                f"the model of {result.get('checkpoint')} misses its gate: "
                + "; ".join(failed))
        return result

    def _evaluate(self, args: ev.EvaluateArgs, run) -> dict[str, Any]:
        result = self._call(run, "ringflow evaluate", ev.evaluate_argv(args))
        shown = {k: v for k, v in result.items() if k not in ("checkpoint", "samples")}
        self.log.info("evaluated %s (step %s) on %s samples: %s", result.get("checkpoint"),
                      result.get("step"), result.get("samples"), shown)
        if args.prompt is not None:
            sampled = self._call(run, "ringflow generate", ev.generate_argv(args))
            result["prompt"], result["generated"] = args.prompt, sampled.get("text", "")
            self.log.info("generated from the prompt %r (seed %s):\n%s%s", args.prompt,
                          args.seed, args.prompt, result["generated"])
        return result

    def _args(self) -> ev.EvaluateArgs:
        values = {name: getattr(self, name) for name in self.template_fields}
        try:
            return ev.parse_args(values)
        except ValueError as exc:
            raise RingflowConfigException(f"task {self.task_id!r}: {exc}") from None

    def _runner(self, args: ev.EvaluateArgs, hook: MultiHostSSHHook | None):
        """``run(argv) -> (code, out, err)`` on this worker or on ``args.host``."""
        if hook is None:
            def local(argv: list[str]) -> tuple[int, str, str]:
                try:
                    done = subprocess.run([sys.executable, *argv], capture_output=True,
                                          text=True, timeout=self.timeout,
                                          stdin=subprocess.DEVNULL)
                except subprocess.TimeoutExpired:
                    return 124, "", f"no result within {self.timeout:g} s"
                return done.returncode, done.stdout, done.stderr
            return local
        from ringflow_provider.launchers.shipping import prepare_hosts

        try:
            prepared = prepare_hosts(hook, [args.host], args.python)[args.host]
        except LaunchError as exc:
            raise launch_exception(exc, str(exc)) from exc
        self.log.info("%s", prepared.describe())

        def remote(argv: list[str]) -> tuple[int, str, str]:
            command = ev.remote_command(args.python, prepared.shipped.pythonpath, argv)
            try:
                return hook.run(args.host, command, self.timeout)
            except LaunchError as exc:
                raise launch_exception(exc, str(exc)) from exc
        return remote

    def _call(self, run, what: str, argv: list[str]) -> dict[str, Any]:
        code, out, err = run(argv)
        try:
            return ev.read_result(what, code, out, err)
        except ValueError as exc:
            where = f" on {self.host}" if self.host else ""
            # 2: the command refused its arguments, checkpoint or data: a retry cannot help
            failure = RingflowJobRefusedException if code == 2 else RingflowJobFailedException
            raise failure(f"{exc}{where}", code, self.host) from None
