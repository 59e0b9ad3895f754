"""How a training job ended, as the task reports it, without Airflow: the summary (XCom) with
the loss plot and the text chart of a job that succeeded, or the failure of one that did not
and whether a retry can help. One code path whether the job was watched by the task or by
the triggerer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringflow.launch.exits import EXIT_CODES, NOT_RETRIED
from ringflow_provider.launchers.job import JobHandle
from ringflow_provider.launchers.local import ringflow_home
from ringflow_provider.launchers.outcome import (
    daemon_lost_failure,
    lost_host_failure,
    part_failure,
    rank_failure,
)
from ringflow_provider.tp_train.report import (
    JobReport,
    failure_cause,
    plot_loss,
    text_chart,
    thin_history,
    write_history,
)
from ringflow_provider.tp_train.spec import path_part, task_folder

# exit codes of ringflow.train that a retry cannot fix: a bad spec, a NaN/inf loss, a
# checkpoint folder that cannot be written
NO_RETRY = {code: EXIT_CODES[code] for code in NOT_RETRIED}


def failed(finals: dict[str, dict[str, Any]]) -> bool:
    return any(f.get("state") != "ended" or f.get("exit_code") != 0 for f in finals.values())


@dataclass(frozen=True)
class Failure:
    """How a job failed: the task's message, the exit code, the host (None: this worker's)
    and whether the host was lost rather than a process failing there."""

    message: str
    exit_code: int
    host: str | None = None
    unreachable: bool = False

    @property
    def retry_helps(self) -> bool:
        return self.exit_code not in NO_RETRY


def failure(handle: JobHandle, report: JobReport,
            finals: dict[str, dict[str, Any]]) -> Failure:
    """The rank that failed first across the hosts, with its cause and its log's tail; else
    the part that ended badly (an agent, a lost supervisor, a host)."""
    hosts: list[str | None] = list(handle.hosts) if handle.show_hosts else [None]
    halted = {h for h, f in finals.items() if f.get("frozen")} | report.frozen_hosts
    first = report.first_failure(hosts, handle.extra.get("clock_offsets"), halted)
    if first is not None:
        host, entry = first
        if handle.show_hosts:
            lost = lost_host_failure(report, list(handle.hosts), host, entry, finals,
                                     handle.extra.get("nproc_per_host", 1),
                                     failure_cause(report.rank_tails.get(host) or []),
                                     report.last_step, gathered=handle.gathered)
            if lost is not None:
                return Failure(lost[0], 1, lost[1], unreachable=True)
        message, code = rank_failure(report, host, entry, handle.log_dir, failure_cause,
                                     handle.hosts[0])
        return Failure(message, code, host)
    if handle.gathered:
        lost = daemon_lost_failure(report, list(handle.hosts),
                                   handle.extra.get("nproc_per_host", 1), report.last_step)
        if lost is not None:
            return Failure(lost[0], 1, lost[1], unreachable=True)
    bad = next((h for h, f in finals.items() if f.get("state") != "ended"
                or f.get("exit_code") != 0), next(iter(finals), None))
    final = finals.get(bad, {})
    message, code = part_failure(report, bad if handle.show_hosts else None, final,
                                 handle.hosts[0])
    return Failure(message, code, bad if handle.show_hosts else None,
                   final.get("state") == "unreachable")


def summarize(handle: JobHandle, report: JobReport, task_id: str
              ) -> tuple[dict[str, Any], list[str]]:
    """The task's summary (its XCom) and the lines to log about it (the plot, the chart).
    The summary's `loss_history` is thinned to at most 1,000 points; the whole history is in
    the JSON lines file `loss_history_file`, beside the plot on this worker."""
    job = report.summary or {}
    world = handle.extra.get("nproc_per_host", 1) * len(handle.hosts)
    mp = handle.extra.get("mp_degree", 1)
    folder = plot_folder(handle)
    history_file = write_history(report.history, folder)
    plot, said = plot_loss(report.history, folder / "loss.png", plot_title(handle, task_id),
                           job.get("resumed_from"))
    messages = [said]
    chart = text_chart(report.history)
    if chart:
        messages.append(f"loss by step:\n{chart}")
    summary = {"final_loss": job.get("final_loss"),
               "loss_history": [[s, v] for s, v in thin_history(report.history)],
               "loss_history_file": str(history_file),
               "samples_per_s": job.get("samples_per_s"), "steps": job.get("steps"),
               "world_size": world, "mp_degree": mp, "dp_degree": world // mp,
               "checkpoint": job.get("checkpoint"), "log_dir": handle.log_dir,
               "plot": plot, "resumed_from": job.get("resumed_from")}
    if "val_loss" in job:   # a job with validation data
        summary.update(val_loss=job["val_loss"], best_val_loss=job.get("best_val_loss"),
                       best_checkpoint=job.get("best_checkpoint"),
                       val_loss_history=[[s, v] for s, v in thin_history(report.val_history)])
    if report.host_times:
        # each host's own work per step (less its waits in the all-reduce) and those waits
        summary.update(host_step_s=report.host_step_s(), host_wait_s=report.host_step_s(2))
    if handle.show_hosts:
        first = handle.hosts[0]
        home = handle.extra.get("homes", {}).get(first)
        summary.update(hosts=list(handle.hosts),
                       checkpoint=absolute(summary["checkpoint"], home),
                       **({"best_checkpoint": absolute(summary["best_checkpoint"], home)}
                          if summary.get("best_checkpoint") else {}),
                       log_dir=f"{first}:{absolute(handle.log_dir, home)}")
    return summary, messages


def plot_title(handle: JobHandle, task_id: str) -> str:
    """Which task's try the plot is of (DAG / run / task), and the job's layout."""
    task, mp = handle.task, handle.extra.get("mp_degree", 1)
    world = handle.extra.get("nproc_per_host", 1) * len(handle.hosts)
    return (f"{task.dag_id} / {task.run_id} / {task_id} (try {task.try_number})\n"
            f"{handle.extra.get('model')}, mp {mp} x dp {world // mp}")


def plot_folder(handle: JobHandle) -> Path:
    """Beside the job's logs on this worker; a remote job's logs are on its hosts, so its
    plot goes to this worker's default log folder of the try."""
    if not handle.show_hosts and handle.log_dir:
        folder = Path(handle.log_dir)
    else:
        task = handle.task
        folder = (Path(ringflow_home()) / "runs" / path_part(task.dag_id) /
                  path_part(task.run_id) / task_folder(task.task_id, task.map_index) /
                  f"try-{task.try_number}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def absolute(path: str | None, home: str | None) -> str | None:
    """A path the agents saw relative to their working folder (the login's home)."""
    if not path or path.startswith("/") or not home:
        return path
    return f"{home.rstrip('/')}/{path}"
