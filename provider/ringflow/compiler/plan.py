"""A prepared program: the steps the executor runs, each an op (the program's own, or one
that stands for several of them) and its kernel. ``prepare`` builds it in five named passes:
take the gradient all-reduces out (``buckets.extract``), fuse GEMM epilogues
(``fuse_gemm.fuse``), put the buckets back as launch and wait steps (``buckets.place``),
fuse the update ops (``fuse_optimizer.fuse``), gather sharded parameters in one step
(``param_gather.fuse``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProgramError
from ..framework.printer import op_to_string
from ..framework.program import Operator, Program
from ..framework.registry import get_op_def, has_op_def
from .build_strategy import BuildStrategy


@dataclass
class Step:
    """One thing the executor runs: ``kernel(ctx)`` with ``ctx.op`` = ``op``. ``index`` is
    the position of the (first) program op it comes from, for error messages."""

    op: Operator
    kernel: Callable[[Any], None]
    index: int
    replaces: tuple[int, ...] = ()   # program op positions a fused step stands for

    def describe(self) -> str:
        what = op_to_string(self.op)
        if len(self.replaces) > 1:
            what += f"   (program ops {', '.join(map(str, self.replaces))})"
        return what


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


def program_steps(program: Program) -> list[Step]:
    """Every op of the global block with its kernel, looked up before anything runs, so an
    op type that left the table fails the run before any variable changes."""
    steps = []
    for i, op in enumerate(program.global_block().ops):
        if not has_op_def(op.type):
            raise ProgramError(f"op {i} ({op.type}): unknown op type {op.type!r}: no op of "
                               f"that type is registered\n  {op_to_string(op)}")
        steps.append(Step(op, get_op_def(op.type).kernel, i, (i,)))
    return steps


def prepare(program: Program, strategy: BuildStrategy, keep: Iterable[str] = ()) -> Plan:
    """The plan ``program`` runs as under ``strategy``; variables in ``keep`` (a run's
    fetch targets) are never fused away."""
    from . import buckets, fuse_gemm, fuse_optimizer, param_gather

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


def readers_of(steps: list[Step]) -> dict[str, list[int]]:
    """Variable name -> positions of the steps that read it, in order."""
    readers: dict[str, list[int]] = {}
    for pos, step in enumerate(steps):
        for name in dict.fromkeys(step.op.input_arg_names):
            readers.setdefault(name, []).append(pos)
    return readers


def writers_of(steps: list[Step]) -> dict[str, list[int]]:
    """Variable name -> positions of the steps that write it, in order."""
    writers: dict[str, list[int]] = {}
    for pos, step in enumerate(steps):
        for name in dict.fromkeys(step.op.output_arg_names):
            writers.setdefault(name, []).append(pos)
    return writers
