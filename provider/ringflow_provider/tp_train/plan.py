"""TPTrainOperator's plan of a job, without Airflow: its rendered arguments validated into one
plan (the spec, the ranks, the hosts, the folders, the env, rank 0's memory estimate), what the
task log says of that plan before the job starts, and the check of the estimate against the
hosts' MemAvailable."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from ringflow.train import memory
from ringflow.train.checkpoint import latest_checkpoint
from ringflow_provider.jobs.unsafe import check_env
from ringflow_provider.launchers.base import Launcher
from ringflow_provider.launchers.job import TaskKey
from ringflow_provider.launchers.local import ringflow_home
from ringflow_provider.rendered import flag
from ringflow_provider.tp_train.args import (
    base_port,
    connections,
    env_dict,
    folder,
    heartbeat_timeout,
    host_list,
    interpreter,
    launcher_name,
    positive_int,
)
from ringflow_provider.tp_train.spec import SPEC_FIELDS, parse_spec, path_part, task_folder

# {home} is $RINGFLOW_HOME, else ~/.ringflow (ringflow_home())
DEFAULT_LOG_DIR = "{home}/runs/{dag_id}/{run_id}/{task_id}/try-{try_number}"
# shared by the tries of a task, so a retry resumes where the failed try left off
DEFAULT_CHECKPOINT_DIR = "{home}/checkpoints/{dag_id}/{run_id}/{task_id}"
# with hosts: relative to the SSH login's home on each host (the agents' working folder)
REMOTE_LOG_DIR = ".ringflow/runs/{dag_id}/{run_id}/{task_id}/try-{try_number}"
REMOTE_CHECKPOINT_DIR = ".ringflow/checkpoints/{dag_id}/{run_id}/{task_id}"
#: the checkpoint_dir that stands for the default folder above
DEFAULT_FOLDER = "default"


def folder_ids(task: TaskKey) -> dict[str, Any]:
    """What the default folders are made of: the ringflow home and the task's ids."""
    return {"home": ringflow_home(), "dag_id": path_part(task.dag_id),
            "run_id": path_part(task.run_id),
            "task_id": task_folder(task.task_id, task.map_index),
            "try_number": task.try_number}


def job_plan(args: Any, ids: Mapping[str, Any]) -> dict[str, Any]:
    """The rendered arguments of a TPTrainOperator (`args`, read by their names), validated
    into the job's plan (spec, nproc, hosts, log_dir, extra, secret, memory, memory_check,
    heartbeat; with hosts also conns, python, launcher, base_port), the default folders
    made from `ids` (`folder_ids`). A bad value raises, naming field and value."""
    hosts = host_list(args.hosts)
    values = {name: getattr(args, name) for name in SPEC_FIELDS}
    if values["checkpoint_dir"] == DEFAULT_FOLDER:
        values["checkpoint_dir"] = (REMOTE_CHECKPOINT_DIR if hosts
                                    else DEFAULT_CHECKPOINT_DIR).format(**ids)
    if not hosts and isinstance(values["checkpoint_dir"], str) and \
            values["checkpoint_dir"].strip():
        values["checkpoint_dir"] = os.path.expanduser(values["checkpoint_dir"].strip())
    spec = parse_spec(values)
    nproc = positive_int(args.nproc_per_host, "nproc_per_host")
    spec.check_layout(nproc * max(len(hosts), 1), nproc)
    extra = env_dict(args.extra_env, "extra_env")
    secret = env_dict(args.secret_env, "secret_env")
    check_env(extra, "extra_env", args.allow_unsafe_env)
    check_env(secret, "secret_env", args.allow_unsafe_env)
    plan = {"spec": spec, "nproc": nproc, "hosts": hosts, "extra": extra,
            "memory": _estimate(spec, nproc * max(len(hosts), 1), extra),
            "memory_check": flag("memory_check", args.memory_check),
            "secret": secret, "launcher": "local",
            "conns": {}, "python": "python3", "base_port": None,
            "heartbeat": heartbeat_timeout(args.heartbeat_timeout)}
    if hosts:
        plan.update(conns=connections(args.ssh_conn_id, hosts),
                    log_dir=folder("log_dir", args.log_dir or REMOTE_LOG_DIR, ids),
                    python=interpreter(args.python), launcher=launcher_name(args.launcher),
                    base_port=base_port(args.base_port, nproc))
    else:
        plan["log_dir"] = os.path.expanduser(
            folder("log_dir", args.log_dir or DEFAULT_LOG_DIR, ids))
    return plan


def _estimate(spec: Any, world_size: int, extra: dict[str, str]) -> memory.MemoryEstimate:
    """The memory rank 0 needs, from its program built here: a `package.module:build_fn`
    that cannot be imported (with ``extra_env``'s ``PYTHONPATH`` on the path, as the ranks
    have it) or returns no model fails here, before anything starts."""
    paths = [p for p in extra.get("PYTHONPATH", "").split(os.pathsep) if p]
    added = [p for p in paths if p not in sys.path]
    sys.path[:0] = added
    try:
        return memory.estimate(spec, world_size)
    finally:
        for p in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(p)


def check_memory(launcher: Launcher, plan: Mapping[str, Any], log: Any) -> None:
    """Every host's MemAvailable holds its ranks' estimate, else a ConfigError naming the
    estimate and each host short of it; unless the plan's memory_check is off. The task log
    `log` says the estimate either way."""
    need: memory.MemoryEstimate = plan["memory"]
    if not plan["memory_check"]:
        log.info("memory: %s; not checked (memory_check is False)", need.describe())
        return
    available = launcher.mem_available()
    log.info("memory: %s; MemAvailable %s", need.describe(), ", ".join(
        f"{host} {value / memory.MIB:.0f} MiB" for host, value in available.items()))
    memory.check_fits(need, plan["nproc"], available)


def log_plan(log: Any, plan: Mapping[str, Any], task: TaskKey) -> None:
    """What the task log `log` says before the job starts: its layout, where its logs go,
    and where its checkpoints are (on this host: the step this try resumes from)."""
    spec, nproc = plan["spec"], plan["nproc"]
    hosts, mp = plan["hosts"], spec.tensor_parallel_degree
    world = nproc * max(len(hosts), 1)
    where = (f"on {len(hosts)} hosts ({','.join(hosts)}), {nproc} ranks each, launcher "
             f"{plan['launcher']}" if hosts else "on this host")
    log.info(
        "training %s %s: %d ranks (mp %d x dp %d), %d steps of %d "
        "samples, %s, %s optimizer; logs and spec in %s", spec.model, where, world, mp,
        world // mp, spec.steps, spec.global_batch_size, spec.dtype,
        spec.optimizer["type"], plan["log_dir"])
    if spec.checkpoint_dir is None:
        log.info("no checkpoints (checkpoint_dir is None): a retry starts over")
        return
    if hosts:
        log.info("checkpoints in %s on each host", spec.checkpoint_dir)
        return
    try:
        latest = latest_checkpoint(spec.checkpoint_dir) if spec.resume else None
    except OSError as exc:  # the ranks report what they cannot read or make there
        log.info("try %d: cannot look for checkpoints in %s: %s", task.try_number,
                 spec.checkpoint_dir, exc.strerror)
        return
    if latest is None:
        log.info("try %d: no complete checkpoint in %s: training starts at step 1",
                 task.try_number, spec.checkpoint_dir)
    elif latest.step >= spec.steps:
        log.info("try %d: the checkpoint of step %d in %s already reaches the %d "
                 "steps asked: nothing to train", task.try_number, latest.step,
                 latest.path, spec.steps)
    else:
        log.info("try %d: resuming from step %d (checkpoint %s)", task.try_number,
                 latest.step, latest.path, resume_step=latest.step)
