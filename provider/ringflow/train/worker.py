"""One rank of a training job: its job built from a JobSpec (the model, the optimizer and
fleet's rewrite: `build`), the startup program run, resumed from the newest complete
checkpoint, then trained to the target, printing metric lines (rank 0) and writing
checkpoints.

Step k (1-based, the ``step`` of its metric line) trains on global batch number k - 1 of
the job's data (see ``data.py``); the reported loss is the global batch's mean: each
rank's mean over its rows, all-reduced over the data-parallel ring and divided by the
data-parallel degree, on every rank, so every rank sees the same bytes and a NaN/inf
loss stops all of them at the same step.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import numpy as np

from ..distributed.collective.communicator import collective_seconds
from ..distributed.collective.reduce_op import ReduceOp
from ..distributed.collective.registry import get_ring
from ..distributed.env import world_endpoints
from ..errors import ConfigError
from ..launch.exits import EXIT_CHECKPOINT, EXIT_NONFINITE, EXIT_OK
from .build import Job, build_job, read_layout
from .checkpoint import (
    Checkpoint,
    Checkpointer,
    CheckpointWriteError,
    Layout,
    discard_after,
    host_complete_steps,
    latest_checkpoint,
    read_best,
    write_best,
)
from .checkpoint import read_meta as read_checkpoint_meta
from .metrics import TIMING_EVERY, Reporter
from .spec import JobSpec


class NonFiniteLoss(Exception):
    """The global loss (or, at a checkpoint, the state) is NaN or infinite."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(f"{what} at step {step}")
        self.step = step


def _across_hosts(spec: JobSpec, layout: Layout) -> bool:
    return bool(spec.checkpoint_dir and spec.resume) and layout.nnodes > 1


def find_start(spec: JobSpec, layout: Layout) -> Checkpoint | None:
    """The checkpoint to resume from: the newest complete one, if resuming. One written by
    another (world size, degree) is a ConfigError naming both. A job of several hosts
    decides once its rings exist (``Trainer._agree_on_start``): None here."""
    if not (spec.checkpoint_dir and spec.resume) or layout.nnodes > 1:
        return None
    found = latest_checkpoint(os.path.abspath(spec.checkpoint_dir))
    if found is not None:
        _check_layout(found, layout)
    return found


def _check_layout(found: Checkpoint, layout: Layout) -> None:
    """Another data-parallel degree is fine (the state is re-sharded from the shards of
    the same model-parallel rank); another tensor-parallel degree is not."""
    if found.mp_degree != layout.mp_degree:
        raise ConfigError(
            f"checkpoint {found.path} was written by a job of world size {found.world_size} "
            f"with tensor_parallel_degree {found.mp_degree}; this job has world size "
            f"{layout.world_size} with tensor_parallel_degree {layout.mp_degree}: run it with "
            f"the same tensor_parallel_degree, or set resume to false or another "
            f"checkpoint_dir")


def run(spec: JobSpec) -> int:
    """Trains one rank of the job described by ``spec``; returns the exit code."""
    layout = read_layout(spec)
    _announce(layout, spec)
    job = build_job(spec, layout)
    start = find_start(spec, layout)
    report = Reporter(sys.stdout, layout.rank == 0, spec.global_batch_size)
    _describe(report, spec, layout)
    if start is not None and start.step >= spec.steps:
        return _finished(report, spec, start, layout)
    return Trainer(job, report).run(start)


def _finished(report: Reporter, spec: JobSpec, start: Checkpoint, layout: Layout) -> int:
    """A checkpoint at or past the target: the job's summary, nothing trained."""
    same = start.world_size == layout.world_size
    meta = read_checkpoint_meta(start.shard(layout.rank if same else
                                            layout.rank % layout.mp_degree))
    report.say(f"checkpoint step {start.step} is at or past the target of {spec.steps} "
               f"steps: nothing to train: {start.path}")
    validation = None
    if meta.get("val_loss") is not None or read_best(spec.checkpoint_dir):
        validation = _validation_summary(meta.get("val_loss"), read_best(spec.checkpoint_dir))
    report.summary(meta.get("loss"), start.step, start.path, start.step, validation)
    return EXIT_OK


def _validation_summary(val_loss: float | None, best: dict | None) -> dict[str, Any]:
    return {"val_loss": val_loss,
            "best_val_loss": None if best is None else best["val_loss"],
            "best_checkpoint": None if best is None else best["path"]}


def _announce(layout: Layout, spec: JobSpec) -> None:
    """Every rank says once where it runs (the launcher tags the line with the rank; the
    operator, gathering several hosts, with the host too)."""
    mp = layout.mp_degree
    print(f"[train] rank {layout.rank} of {layout.world_size} starts on host "
          f"{layout.host} ({os.uname().nodename}, pid {os.getpid()}): mp rank "
          f"{layout.rank % mp} of {mp}, dp rank {layout.rank // mp} of "
          f"{spec.dp_degree(layout.world_size)}", flush=True)


def _describe(report: Reporter, spec: JobSpec, layout: Layout) -> None:
    dp = spec.dp_degree(layout.world_size)
    report.say(f"job: model {spec.model}, {layout.world_size} rank(s) = mp "
               f"{layout.mp_degree} x dp {dp} on {layout.nnodes} host(s), global "
               f"batch {spec.global_batch_size}, {spec.steps} steps, data {spec.data}, "
               f"optimizer {spec.optimizer['type']}, {spec.dtype}, seed {spec.seed}"
               + (", amp" if spec.amp else "") + (", recompute" if spec.recompute else "")
               + (f", sharding stage {spec.sharding_stage}" if spec.sharding_stage else ""))


class Trainer:
    """The loop of one rank, from a fresh start or a checkpoint to ``spec.steps``."""

    def __init__(self, job: Job, report: Reporter) -> None:
        from ..executor import Executor, Scope

        self.job, self.report = job, report
        self.spec = job.spec
        self.exe, self.scope = Executor(), Scope()
        self.checkpoints = None
        if self.spec.checkpoint_dir:
            self.checkpoints = Checkpointer(self.spec.checkpoint_dir, job.layout, job.main,
                                            self.scope, self._barrier)
        self.last_checkpoint: str | None = None
        self.val: dict[str, float] | None = None    # the newest validation
        self.best: dict[str, Any] | None = None     # the best checkpoint by validation loss

    def run(self, start: Checkpoint | None) -> int:
        self.exe.run(self.job.startup, scope=self.scope)
        if start is None and _across_hosts(self.spec, self.job.layout):
            start = self._agree_on_start()
            if start is not None and start.step >= self.spec.steps:
                return _finished(self.report, self.spec, start, self.job.layout)
        step, loss = self._restore(start) if start is not None else (0, None)
        if self.checkpoints is not None:
            self._discard_after(step)
        self.report.start_clock()
        try:
            loss = self._train_from(step, loss)
        except (NonFiniteLoss, CheckpointWriteError) as exc:
            where = self.last_checkpoint or "none (no checkpoint was written)"
            print(f"[train] error: stopping: the {exc}; last good checkpoint: {where}",
                  file=sys.stderr, flush=True)
            return EXIT_NONFINITE if isinstance(exc, NonFiniteLoss) else EXIT_CHECKPOINT
        validation = None
        if self.job.evaluator is not None:
            validation = _validation_summary(self.val and self.val["val_loss"], self.best)
        self.report.summary(loss, self.spec.steps, self.last_checkpoint,
                            None if start is None else start.step, validation)
        return EXIT_OK

    def _restore(self, start: Checkpoint) -> tuple[int, float | None]:
        meta = self.checkpoints.restore(start)
        self.exe.set_run_count(self.job.main, int(meta["run_count"]))
        scheduler = self.job.main.lr_scheduler
        if scheduler is not None and meta.get("lr_epoch") is not None:
            scheduler.step(int(meta["lr_epoch"]))  # the position; the rate recomputed
        self.last_checkpoint = start.path
        best = read_best(self.spec.checkpoint_dir)
        self.best = best if best is not None and best["step"] <= start.step else None
        if meta.get("val_loss") is not None:
            self.val = {"val_loss": meta["val_loss"]}
        self.report.say(f"resuming from step {start.step}: {start.path}")
        return start.step, meta.get("loss")

    def _discard_after(self, step: int) -> None:
        """Steps after the start point are leftovers (an interrupted write, or a history
        this job replaces); each host removes its own, then every rank waits."""
        if self.job.layout.local_rank == 0:
            removed = discard_after(self.checkpoints.root, step, self.job.layout)
            for s in removed:
                self.report.say(f"removed checkpoint folder step-{s:08d}: it is after the "
                                f"start point (step {step})")
        self._barrier()

    def _train_from(self, done: int, loss: float | None) -> float | None:
        spec = self.spec
        timed = self.job.layout.nnodes > 1  # per-host step times: a straggler is a host
        window = [0, 0.0, 0.0]  # steps, own work, waits in collectives (seconds)
        for step in range(done + 1, spec.steps + 1):
            lr = self.job.optimizer.get_lr()
            began, waited = time.perf_counter(), collective_seconds()
            loss = self._step(step)
            if timed:
                wait = collective_seconds() - waited
                window[0] += 1
                window[1] += time.perf_counter() - began - wait
                window[2] += wait
            last = step == spec.steps
            checkpoint = self.checkpoints is not None and (
                step % spec.checkpoint_every == 0 or last)
            val = None
            if self.job.evaluator is not None and (
                    step % spec.eval_every == 0 or last or checkpoint):
                val = self.val = self.job.evaluator.run(self.exe, self.scope)
                if not math.isfinite(val["val_loss"]):
                    raise NonFiniteLoss(step, f"validation loss is {val['val_loss']}")
            logged = step == done + 1 or step % spec.log_every == 0 or last or val is not None
            self.report.step_done(step, loss, lr, logged, val)
            if timed and (step % TIMING_EVERY == 0 or last):
                self._share_timing(step, window)
                window = [0, 0.0, 0.0]
            if checkpoint:
                self._checkpoint(step, loss, val)
        return loss

    def _share_timing(self, step: int, window: list) -> None:
        """Every rank's own work and collective wait of the window, summed over the global
        ring; rank 0 prints each host's means per step (a timing line): a host whose ranks'
        own work takes longer than the others' is a straggler, and the others wait for it."""
        layout = self.job.layout
        steps = window[0]
        if not steps:
            return
        world = layout.world_size
        mine = np.zeros(2 * world, dtype=np.float64)
        mine[layout.rank], mine[world + layout.rank] = window[1] / steps, window[2] / steps
        get_ring(self.job.rings[0]).all_reduce(mine)
        per = layout.local_size
        hosts = range(layout.nnodes)
        if layout.rank != 0:
            return
        try:
            endpoints = world_endpoints(os.environ)
            names = [endpoints[h * per].host for h in hosts]
        except (ConfigError, IndexError):
            names = [f"host {h}" for h in hosts]
        self.report.timing(
            step, steps, names,
            [round(float(mine[h * per:(h + 1) * per].mean()), 6) for h in hosts],
            [round(float(mine[world + h * per:world + (h + 1) * per].mean()), 6)
             for h in hosts])

    def _step(self, step: int) -> float:
        """One step: a run of the main program per micro-step (the last applies the
        update); the loss is the global batch's mean."""
        job = self.job
        value = None
        for rows in job.rows:
            feed = job.data.train.batch(step - 1, rows)
            # A NaN/inf is reported once, by the check below, not as numpy warnings per op.
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                micro, = self.exe.run(job.main, feed=feed, fetch_list=[job.model.loss],
                                      scope=self.scope)
            value = micro if value is None else value + micro
        value = value / len(job.rows)
        dp = self.spec.dp_degree(job.layout.world_size)
        if dp > 1:
            get_ring(self.job.rings[1]).all_reduce(value)
            value /= dp
        loss = float(value.reshape(-1)[0])
        if not math.isfinite(loss):
            raise NonFiniteLoss(step, f"loss is {loss} (the global batch's mean)")
        return loss

    def _checkpoint(self, step: int, loss: float, val: dict[str, float] | None) -> None:
        if not self._state_finite():
            raise NonFiniteLoss(step, "parameters or optimizer state are not finite after "
                                      "the update")
        scheduler = self.job.main.lr_scheduler
        meta = {"run_count": self.exe.run_count(self.job.main), "loss": loss,
                "lr_epoch": None if scheduler is None else scheduler.last_epoch,
                "world_size": self.job.layout.world_size,
                "mp_degree": self.job.layout.mp_degree, "spec": self.spec.to_dict(),
                "tokenizer": None if self.job.data.tokenizer is None
                else self.job.data.tokenizer.to_dict(),
                "val_loss": None if val is None else val["val_loss"]}
        better = val is not None and (self.best is None
                                      or val["val_loss"] < self.best["val_loss"])
        keep = {self.best["step"]} if self.best is not None and not better else set()
        self.last_checkpoint = self.checkpoints.save(step, meta, keep)
        self.report.say(f"checkpoint step {step}: {self.last_checkpoint}")
        if better:
            self.best = {"step": step, "val_loss": val["val_loss"],
                         "path": self.last_checkpoint}
            if self.job.layout.local_rank == 0:
                write_best(self.checkpoints.root, self.best)
            self.report.say(f"best checkpoint so far (val_loss {val['val_loss']:.6g}): "
                            f"{self.last_checkpoint}")

    def _state_finite(self) -> bool:
        """Whether every rank's persistable state is finite (agreed over the global ring)."""
        bad = sum(int(not np.all(np.isfinite(a)))
                  for a in self.checkpoints.persistables().values() if a.dtype.kind == "f")
        flag = np.array([bad], dtype=np.int64)
        get_ring(self.job.rings[0]).all_reduce(flag)
        return int(flag[0]) == 0

    def _agree_on_start(self) -> Checkpoint | None:
        """The newest step complete on every host, when hosts do not share the checkpoint
        folder: each host sees only its own part, so the ranks agree over the global ring
        (the newest step every rank's host has; a candidate some host lacks moves the bound
        below it). One written by another layout is a ConfigError naming both."""
        layout = self.job.layout
        mine = {c.step: c for c in host_complete_steps(
            os.path.abspath(self.spec.checkpoint_dir), layout.host)}
        ring = get_ring(self.job.rings[0])
        bound = 1 << 62
        while True:
            newest = np.array([max((s for s in mine if s <= bound), default=-1)], np.int64)
            ring.all_reduce(newest, op=ReduceOp.MIN)
            step = int(newest[0])
            if step < 0:
                return None
            held = np.array([int(step in mine)], np.int64)
            ring.all_reduce(held, op=ReduceOp.MIN)
            if held[0]:
                _check_layout(mine[step], layout)
                return mine[step]
            bound = step - 1

    def _barrier(self) -> None:
        get_ring(self.job.rings[0]).barrier()
