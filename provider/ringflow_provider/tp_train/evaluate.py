"""TPEvaluateOperator without Airflow: its arguments at the boundary (pydantic), the
``ringflow evaluate`` / ``ringflow generate`` command lines it runs, reading their JSON
line, and the model gate (``fail_if``)."""

from __future__ import annotations

import json
import math
import operator
import shlex
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ringflow_provider.rendered import json_text, none_text

#: the comparisons ``fail_if`` takes: the task fails when ``metric <op> bound`` holds
GATE_OPS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}
_SHOWN = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _gate(value: Any) -> Any:
    return json_text(value, "fail_if")


class EvaluateArgs(BaseModel):
    """The rendered arguments of a TPEvaluateOperator, validated."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(min_length=1)
    data: Annotated[str | None, BeforeValidator(none_text)] = None
    batch_size: Annotated[int | None, BeforeValidator(none_text)] = Field(None, ge=1)
    prompt: Annotated[str | None, BeforeValidator(none_text)] = None
    max_new_tokens: int = Field(200, ge=0)
    temperature: float = Field(0.8, ge=0)
    top_k: Annotated[int | None, BeforeValidator(none_text)] = Field(None, ge=1)
    seed: int = Field(0, ge=0)
    fail_if: Annotated[dict[str, dict[Literal["gt", "ge", "lt", "le"], float]],
                       BeforeValidator(_gate)] = Field(default_factory=dict)
    host: Annotated[str | None, BeforeValidator(none_text)] = None
    ssh_conn_id: str = Field("ssh_default", min_length=1)
    python: str = Field("python3", min_length=1)


def parse_args(values: Mapping[str, Any]) -> EvaluateArgs:
    """The arguments, or a ValueError naming each bad field and its value."""
    try:
        return EvaluateArgs(**values)
    except ValidationError as exc:
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']} "
                 f"(got {e.get('input')!r})" for e in exc.errors()]
        raise ValueError("; ".join(parts)) from None


def evaluate_argv(args: EvaluateArgs) -> list[str]:
    """``-m ringflow.evaluate CHECKPOINT [--data PATH] [--batch-size N]`` (after python)."""
    argv = ["-m", "ringflow.evaluate", args.checkpoint]
    if args.data:
        argv += ["--data", args.data]
    if args.batch_size:
        argv += ["--batch-size", str(args.batch_size)]
    return argv


def generate_argv(args: EvaluateArgs) -> list[str]:
    """``-m ringflow.generate CHECKPOINT --prompt ... --json`` (after python)."""
    argv = ["-m", "ringflow.generate", args.checkpoint, "--prompt", args.prompt or "",
            "--max-new-tokens", str(args.max_new_tokens), "--temperature",
            repr(args.temperature), "--seed", str(args.seed), "--json"]
    if args.top_k:
        argv += ["--top-k", str(args.top_k)]
    return argv


def remote_command(python: str, pythonpath: str, argv: list[str]) -> str:
    """The shell command of ``python argv`` on a host, the shipped runtime on its path;
    every word quoted, so no argument can add a shell command."""
    return f"PYTHONPATH={shlex.quote(pythonpath)} " + shlex.join([python, *argv])


def read_result(what: str, code: int, out: str, err: str) -> dict[str, Any]:
    """The JSON line a command printed last, or a ValueError saying why there is none (the
    command's own error line when it failed)."""
    if code != 0:
        said = err.strip().splitlines()[-1] if err.strip() else f"exit code {code}"
        raise ValueError(f"{what} failed (exit code {code}): {said}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    try:
        value = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise ValueError(f"{what} printed no JSON result: {out.strip()[-200:]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} printed {value!r}, not a JSON object")
    return value


def gate_failures(fail_if: Mapping[str, Mapping[str, float]],
                  metrics: Mapping[str, Any]) -> list[str]:
    """Each rule of ``fail_if`` that the metrics meet (so the task fails), as text: a
    metric the result lacks, or that is not a finite number, fails too."""
    failed = []
    for name, rules in fail_if.items():
        value = metrics.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not math.isfinite(value):
            failed.append(f"{name} is {value!r}, not a finite number (fail_if "
                          f"{name} {dict(rules)})")
            continue
        for op, bound in rules.items():
            if GATE_OPS[op](value, bound):
                failed.append(f"{name} {value:.6g} {_SHOWN[op]} {bound:g}")
    return failed
