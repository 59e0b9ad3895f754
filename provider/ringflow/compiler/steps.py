"""The steps a prepared program runs (``Step``: an op and its kernel), the steps of a
program as written (``program_steps``), and who reads and writes what among steps: what
every pass of the prepare step (plan.py) works on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ProgramError
from ..framework.printer import op_to_string
from ..framework.program import Operator, Program
from ..framework.registry import get_op_def, has_op_def


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
