"""TPTrainOperator's reporting, without Airflow: the progress line a person reads, the loss
history from the job's lines (thinned for XCom, whole in a JSON lines file), each host's step
times and the stragglers among them, a rank's last words, a text chart and the loss plot."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringflow_provider.launchers.lines import METRIC, RESULT, SUMMARY, TIMING, JobLine
from ringflow_provider.launchers.outcome import AgentOutcome


# progress -----------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    seconds = max(round(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_line(metric: Mapping[str, Any], steps: int, first_step: int = 1) -> str:
    """``step 40/200  loss 0.4132  lr 1.0e-03  1,850 samples/s  eta 0:00:31``; the eta
    assumes the steps still to do run as fast as those of this run so far."""
    step, elapsed = int(metric["step"]), float(metric.get("elapsed_s") or 0.0)
    done = step - first_step + 1
    parts = [f"step {step}/{steps}", f"loss {float(metric['loss']):.4f}",
             f"lr {float(metric['lr']):.1e}"]
    rate = metric.get("samples_per_s")
    if metric.get("val_loss") is not None:
        parts.append(f"val_loss {float(metric['val_loss']):.4f}")
    if rate is not None:
        parts.append(f"{float(rate):,.0f} samples/s")
    if done > 0 and step < steps:
        parts.append(f"eta {_duration(elapsed / done * (steps - step))}")
    return "  ".join(parts)


class JobReport(AgentOutcome):
    """What the job's output says: rank 0's metric lines (the loss history), its summary, and
    what each agent said (`AgentOutcome`)."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[tuple[int, float]] = []
        self.val_history: list[tuple[int, float]] = []
        self.summary: dict[str, Any] | None = None
        # host -> [steps timed, their own work, their waits in collectives] (seconds)
        self.host_times: dict[str, list[float]] = {}

    def feed(self, line: JobLine) -> None:
        super().feed(line)
        if line.kind == METRIC and isinstance(line.payload.get("step"), int):
            self.history.append((line.payload["step"], float(line.payload["loss"])))
            if line.payload.get("val_loss") is not None:
                self.val_history.append((line.payload["step"],
                                         float(line.payload["val_loss"])))
        elif line.kind == SUMMARY:
            self.summary = line.payload
        elif line.kind == TIMING:
            for host, own, wait in timing_rows(line.payload):
                times = self.host_times.setdefault(host, [0, 0.0, 0.0])
                steps = line.payload["steps"]
                times[0] += steps
                times[1] += own * steps
                times[2] += wait * steps

    def host_step_s(self, which: int = 1) -> dict[str, float]:
        """Each host's mean time per step of its ranks' own work (`which` 2: of their waits
        in the all-reduce), over every step timed."""
        return {host: round(t[which] / t[0], 4) for host, t in self.host_times.items() if t[0]}

    @property
    def last_step(self) -> int | None:
        return self.history[-1][0] if self.history else None


# stragglers ---------------------------------------------------------------------------------
#: a host whose ranks' own work per step takes this many times the other hosts' is a straggler
STRAGGLER_RATIO = 1.5
STRAGGLER_MIN_S = 0.002  # ... and at least this much longer (a tiny step's noise is none)


def timing_rows(payload: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """(host, own work per step, wait per step) of a timing line; [] for a malformed one."""
    hosts, own, wait = (payload.get(k) for k in ("hosts", "host_step_s", "host_wait_s"))
    steps = payload.get("steps")
    if not (isinstance(hosts, list) and isinstance(own, list) and isinstance(wait, list)
            and len(hosts) == len(own) == len(wait) and isinstance(steps, int) and steps > 0):
        return []
    rows = list(zip(hosts, own, wait))
    if not all(isinstance(h, str) and finite(o) and finite(w) for h, o, w in rows):
        return []
    return [(h, float(o), float(w)) for h, o, w in rows]


def stragglers(payload: Mapping[str, Any]) -> list[tuple[str, float, float, float]]:
    """(host, how many times slower, its own work per step, the others' median, their
    wait per step) of each straggler of a timing line: its ranks' own work per step (the
    step less the time they spent in the all-reduce) STRAGGLER_RATIO times the other
    hosts' median or more."""
    rows = timing_rows(payload)
    found = []
    for host, own, _ in rows:
        others = sorted(o for h, o, _ in rows if h != host)
        if not others:
            continue
        median = others[len(others) // 2] if len(others) % 2 else \
            (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
        if own >= STRAGGLER_RATIO * median and own - median >= STRAGGLER_MIN_S:
            waits = [w for h, _, w in rows if h != host]
            found.append((host, own / max(median, 1e-9), own, median,
                          sum(waits) / len(waits)))
    return found


class Presenter:
    """How a training job's lines read in the task log, attached or deferred alike: metric
    lines as progress lines (`progress_line`), the summary and the agents' results as one
    line each, every other line as the job printed it (tagged with its host)."""

    def __init__(self, steps: int, first_step: int | None = None) -> None:
        self.steps = steps
        self.first_step = first_step
        self._warned: dict[str, float] = {}  # straggler -> how much slower when last said

    def __call__(self, line: JobLine) -> tuple[str, str]:
        """(level "info" | "warning", text)."""
        if line.kind == METRIC:
            self.first_step = self.first_step or line.payload["step"]
            return "info", progress_line(line.payload, self.steps, self.first_step)
        if line.kind == SUMMARY:
            return "info", f"summary: {json.dumps(line.payload)}"
        if line.kind == TIMING:
            return self._timing(line.payload)
        if line.kind == RESULT:
            where = f" on {line.host}" if line.host else ""
            return "info", (f"launcher{where}: {line.payload.get('cause')} (exit code "
                            f"{line.payload.get('exit_code')})")
        return ("info" if line.stream == "stdout" else "warning"), line.shown

    def _timing(self, payload: Mapping[str, Any]) -> tuple[str, str]:
        """A straggler as a warning (when first seen, or a quarter slower than last said),
        else each host's step times as one line. The try's first window is its warm-up (the
        first step builds and allocates what the others reuse, unevenly across hosts): its
        times are shown, no straggler is named from it."""
        last, steps = payload.get("step"), payload.get("steps")
        known = isinstance(last, int) and isinstance(steps, int)
        window = f"steps {last - steps + 1}-{last}" if known else "recent steps"
        warm_up = known and last - steps + 1 <= (self.first_step or 1)
        slow = [] if warm_up else stragglers(payload)
        for host in [h for h in self._warned if h not in {s[0] for s in slow}]:
            del self._warned[host]  # it caught up: say it again if it falls behind
        news = [s for s in slow if s[1] >= 1.25 * self._warned.get(s[0], 0.0)]
        if news:
            for host, ratio, *_ in news:
                self._warned[host] = ratio
            return "warning", "; ".join(
                f"straggler: host {host} is {ratio:.1f} x slower than the other hosts, "
                f"{window}: its ranks' own work takes {own:.4f} s per step, theirs "
                f"{median:.4f} s, and they wait {wait:.4f} s per step for it in the all-reduce"
                for host, ratio, own, median, wait in news)
        rows = timing_rows(payload)
        return "info", (f"host step times, {window} (own work / waiting in the all-reduce, "
                        "per step): " + ", ".join(f"{h} {o:.4f} / {w:.4f} s"
                                                  for h, o, w in rows))


# the loss history ------------------------------------------------------------------------------
#: at most this many points of the loss history go into XCom (the metadata database)
XCOM_HISTORY_POINTS = 1000
HISTORY_FILE = "loss_history.jsonl"


def thin_history(history: list[tuple[int, float]], limit: int = XCOM_HISTORY_POINTS
                 ) -> list[tuple[int, float]]:
    """At most `limit` points of `history`, evenly spaced over its points, the first and the
    last always kept; a history that fits is returned whole."""
    if len(history) <= limit:
        return list(history)
    if limit < 2:
        return list(history[-limit:]) if limit else []
    last = len(history) - 1
    return [history[round(i * last / (limit - 1))] for i in range(limit)]


def write_history(history: list[tuple[int, float]], folder: Path) -> Path:
    """The whole history as JSON lines (``{"step": 1, "loss": 2.31}``) in `folder`."""
    path = folder / HISTORY_FILE
    text = "".join(json.dumps({"step": step, "loss": loss}) + "\n" for step, loss in history)
    path.write_text(text)
    return path


def read_history(path: Path) -> list[tuple[int, float]]:
    """The history `write_history` wrote."""
    points = (json.loads(line) for line in path.read_text().splitlines() if line)
    return [(int(p["step"]), float(p["loss"])) for p in points]


# A rank's last words: ringflow.train's own error lines, else a Python exception's last line
# (``CommError: ...``, ``RuntimeError: ...``).
_CAUSE = re.compile(r"^(?:\[rank \d+\] )?(?P<text>\[train\] error: .*|python -m ringflow\.train: "
                    r"error: .*|(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)"
                    r"(?:: .*)?)\Z")


def failure_cause(lines: list[str]) -> str | None:
    """Why a rank failed, from the tail of its log: the last error line there, or None."""
    for line in reversed(lines):
        found = _CAUSE.match(line.strip())
        if found:
            return found["text"]
    return None


# pictures -----------------------------------------------------------------------------------
def chart_columns(history: list[tuple[int, float]], width: int) -> list[float]:
    """The value of each column of `text_chart`: one point per column while the points fit
    in `width`, else the mean of each of `width` runs of consecutive points (as even as they
    divide), so the first point is in the first column, the last in the last and no column
    is empty."""
    losses = [v for _, v in history]
    count = min(width, len(losses))
    runs = [losses[c * len(losses) // count:(c + 1) * len(losses) // count]
            for c in range(count)]
    return [sum(run) / len(run) for run in runs]


def text_chart(history: list[tuple[int, float]], width: int = 60, height: int = 10) -> str:
    """The loss curve as text for the task log: one column per point (or per run of points,
    their mean, when there are more than `width`), a '*' at its height; the highest column in
    the top row and the lowest in the bottom row, which are labelled with their loss (a flat
    curve is one row)."""
    if len(history) < 2:
        return ""
    columns = chart_columns(history, width)
    lo, hi = min(columns), max(columns)
    height = height if hi > lo else 1
    rows = [[" "] * len(columns) for _ in range(height)]
    for x, value in enumerate(columns):
        level = (value - lo) / (hi - lo) if hi > lo else 0.0
        rows[height - 1 - round(level * (height - 1))][x] = "*"
    label = max(len(f"{hi:.4g}"), len(f"{lo:.4g}"))
    lines = []
    for i, row in enumerate(rows):
        tag = f"{hi:.4g}" if i == 0 else f"{lo:.4g}" if i == height - 1 else ""
        lines.append(f"{tag:>{label}} |{''.join(row)}".rstrip())
    lines.append(f"{'':>{label}} +{'-' * len(columns)}")
    left, right = f"step {history[0][0]}", f"step {history[-1][0]}"
    gap = " " * max(len(columns) - len(left) - len(right), 2)
    lines.append(f"{'':>{label}}  {left}{gap}{right}")
    return "\n".join(lines)


def plot_loss(history: list[tuple[int, float]], path: Path, title: str,
              resumed_from: int | None = None) -> tuple[str | None, str]:
    """Writes the loss curve as a PNG; returns (path or None, what happened)."""
    if not history:
        return None, "no metric line came, so there is no loss plot"
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return None, ("no loss plot: matplotlib is not installed (pip install "
                      "'airflow-provider-ringflow[plot]')")
    fig = loss_figure(plt, history, title, resumed_from)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
    return str(path), f"loss plot: {path}"


def loss_figure(plt: Any, history: list[tuple[int, float]], title: str,
                resumed_from: int | None = None) -> Any:
    """The loss plot's figure: the curve, titled, axes labelled with their units, the step a
    resumed try went on from marked; the loss on a log scale when it spans decades."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([s for s, _ in history], [v for _, v in history], marker="." if
            len(history) < 50 else None, label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats, mean over the global batch)")
    ax.set_title(title, fontsize=10)
    if all(v > 0 for _, v in history) and max(v for _, v in history) / max(
            min(v for _, v in history), 1e-300) > 50:
        ax.set_yscale("log")
    if resumed_from is not None:
        ax.axvline(resumed_from, color="grey", linestyle="--", linewidth=1,
                   label=f"resumed from the checkpoint of step {resumed_from}")
        ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
