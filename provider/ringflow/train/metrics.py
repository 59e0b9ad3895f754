"""The lines a training job prints for machines, and the parser the Airflow operator uses.

    [train] metric {"step": 40, "loss": 0.41320812702178955, "lr": 0.001,
                    "samples_per_s": 1850.2, "elapsed_s": 0.69}
    [train] summary {"final_loss": 0.0871, "steps": 200, "samples_per_s": 1901.7,
                     "checkpoint": "/ckpt/step-00000200", "resumed_from": null}
    [train] timing {"step": 40, "steps": 20, "hosts": ["10.77.0.2", "10.77.0.3"],
                    "host_step_s": [0.0121, 0.0312], "host_wait_s": [0.0205, 0.0014]}

A timing line (jobs on several hosts, every TIMING_EVERY steps and at the last) gives each
host's mean time per step of the window: its ranks' own work (`host_step_s`: the step less
the time spent in collectives, waiting for the others) and that wait (`host_wait_s`).

A job with validation data adds ``val_loss`` (and a classifier's ``val_accuracy``) to the
metric line of each step it validated at (such a step always has a line), and
``val_loss``, ``best_val_loss`` and ``best_checkpoint`` to its summary.

Each is one whole line (shown wrapped here). Only rank 0 prints them; the launcher
prefixes worker lines with ``[rank N] ``, and ``parse_train_line`` accepts both. Floats
are written by ``json`` at full precision (a float's repr round-trips), so a loss read
back is bitwise the one the job computed. Other ``[train] `` lines are for people.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, TextIO

PREFIX = "[train] "
METRIC = "metric"
SUMMARY = "summary"
TIMING = "timing"
TIMING_EVERY = 20
METRIC_KEYS = ("step", "loss", "lr", "samples_per_s", "elapsed_s")
VALIDATION_METRIC_KEYS = ("val_loss", "val_accuracy")
SUMMARY_KEYS = ("final_loss", "steps", "samples_per_s", "checkpoint", "resumed_from")
VALIDATION_SUMMARY_KEYS = ("val_loss", "best_val_loss", "best_checkpoint")

# an optional launcher prefix: "[rank 3] " or, gathered over hosts, "[host/rank 3] "
_LINE_RE = re.compile(
    r"^(?:\[(?:[^\]/\s]+/)?rank \d+\] )?\[train\] (metric|summary|timing) (\{.*\})\Z")


def format_line(kind: str, payload: dict[str, Any]) -> str:
    """``[train] <kind> {json}`` (no newline). NaN and infinity are refused: JSON has no
    such numbers, and a job stops on a non-finite loss before it would log one."""
    return f"{PREFIX}{kind} {json.dumps(payload, allow_nan=False)}"


def parse_train_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """``("metric" | "summary" | "timing", payload)`` for a machine line, with or without
    the launcher's ``[rank N] `` prefix and trailing newline; None for any other line
    (including one whose JSON does not parse to an object)."""
    match = _LINE_RE.match(line.rstrip("\r\n"))
    if match is None:
        return None
    try:
        payload = json.loads(match.group(2))
    except ValueError:
        return None
    return (match.group(1), payload) if isinstance(payload, dict) else None


class Reporter:
    """Rank 0's output: metric lines with rates, human lines, the summary. On other ranks
    (``enabled=False``) it prints nothing but keeps the same clock."""

    def __init__(self, out: TextIO, enabled: bool, global_batch_size: int) -> None:
        self.out, self.enabled, self.batch = out, enabled, global_batch_size
        self.start_clock()

    def start_clock(self) -> None:
        """Training starts now: ``elapsed_s`` and the rates count from here."""
        self.started = self._last_time = time.perf_counter()
        self.steps_run = self._last_step_count = 0

    def say(self, text: str) -> None:
        """A line for people, ``[train] <text>``."""
        self._write(PREFIX + text)

    def step_done(self, step: int, loss: float, lr: float, log: bool,
                  validation: dict[str, float] | None = None) -> None:
        """Counts a trained step; prints its metric line when ``log``, with ``validation``'s
        values if given. ``samples_per_s`` is the global samples per second since the
        previous metric line."""
        self.steps_run += 1
        if not log:
            return
        now = time.perf_counter()
        done = self.steps_run - self._last_step_count
        rate = done * self.batch / max(now - self._last_time, 1e-9)
        self._last_time, self._last_step_count = now, self.steps_run
        self._write(format_line(METRIC, {"step": step, "loss": loss, "lr": lr,
                                         "samples_per_s": rate,
                                         "elapsed_s": now - self.started,
                                         **(validation or {})}))

    def timing(self, step: int, steps: int, hosts: list[str], host_step_s: list[float],
               host_wait_s: list[float]) -> None:
        """A timing line: each host's mean own work and collective wait per step over the
        last `steps` steps."""
        self._write(format_line(TIMING, {"step": step, "steps": steps, "hosts": hosts,
                                         "host_step_s": host_step_s,
                                         "host_wait_s": host_wait_s}))

    def summary(self, final_loss: float | None, steps: int, checkpoint: str | None,
                resumed_from: int | None,
                validation: dict[str, Any] | None = None) -> dict[str, Any]:
        """Prints and returns the summary; ``samples_per_s`` is over the steps this run
        trained (null when it trained none); ``validation``: a job with validation data's
        ``VALIDATION_SUMMARY_KEYS``."""
        seconds = time.perf_counter() - self.started
        rate = self.steps_run * self.batch / max(seconds, 1e-9) if self.steps_run else None
        payload = {"final_loss": final_loss, "steps": steps, "samples_per_s": rate,
                   "checkpoint": checkpoint, "resumed_from": resumed_from,
                   **(validation or {})}
        self._write(format_line(SUMMARY, payload))
        return payload

    def _write(self, line: str) -> None:
        if self.enabled:
            self.out.write(line + "\n")
            self.out.flush()
