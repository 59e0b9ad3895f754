"""A prepared program: the steps the executor runs, each an op (the program's own, or one
that stands for several of them) and its kernel. ``prepare`` builds it in five named passes:
take the gradient all-reduces out (``buckets.extract``), fuse GEMM epilogues
(``fuse_gemm.fuse``), put the buckets back as launch and wait steps (``buckets.place``),
fuse the update ops (``fuse_optimizer.fuse``), gather sharded parameters in one step
(``param_gather.fuse``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..framework.program import Program
from . import buckets, fuse_gemm, fuse_optimizer, param_gather
from .build_strategy import BuildStrategy
from .steps import Step, program_steps, readers_of, writers_of

__all__ = ["Plan", "Step", "prepare", "program_steps", "readers_of", "writers_of"]


@dataclass
class Plan:
    """The steps of one program version under one strategy. ``hidden`` are variables the
    plan does not produce (fused away), so they cannot be fetched; ``buckets`` the gradient
    buckets (see buckets.py)."""

    steps: list[Step]
    hidden: frozenset[str] = frozenset()
    buckets: list[Any] = field(default_factory=list)

    def count(self, op_type: str) -> int:
        return sum(1 for s in self.steps if s.op.type == op_type)

    def __str__(self) -> str:
        lines = [f"plan: {len(self.steps)} steps, {len(self.buckets)} gradient buckets"]
        lines += [f"  {i:3d}  {s.describe()}" for i, s in enumerate(self.steps)]
        return "\n".join(lines)


def prepare(program: Program, strategy: BuildStrategy, keep: Iterable[str] = ()) -> Plan:
    """The plan ``program`` runs as under ``strategy``; variables in ``keep`` (a run's
    fetch targets) are never fused away."""
    keep = frozenset(keep)
    steps = program_steps(program)
    pending = None
    if strategy.fuse_all_reduce_ops:
        steps, pending = buckets.extract(steps)
    hidden: frozenset[str] = frozenset()
    if strategy.fuse_gemm_epilogue:
        steps, hidden = fuse_gemm.fuse(steps, program.global_block(), keep)
    made: list[Any] = []
    if pending is not None:
        steps, made = buckets.place(steps, pending, program.global_block(), strategy)
    if strategy.fuse_all_optimizer_ops:
        steps = fuse_optimizer.fuse(steps, program.global_block())
    if strategy.fuse_all_reduce_ops:
        steps = param_gather.fuse(steps, program.global_block())
    return Plan(steps, hidden, made)


