"""The building blocks of reverse-mode autodiff over a block, shared by ``backward``
(``append_backward``, ``gradients``) and ``recompute`` (the backward pass with checkpoints):
which variables can carry a gradient (forward sweep), which ops lie between them and the
targets (backward sweep), the grad ops their grad makers give (in reverse op order), and
accumulation: a gradient written by several grad ops is written under renamed partials
``x@GRAD@RENAME@k`` and summed by a ``sum`` op before it is read. The walks are loops over
the op list, never recursion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .errors import ProgramError
from .framework.program import Block, Operator, Parameter, Variable
from .framework.registry import (
    EMPTY_VAR_NAME,
    GRAD_SUFFIX,
    OpDesc,
    get_op_def,
)
from .framework.roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole

RENAME_SUFFIX = "@RENAME@"


def var_names(items: Iterable[Any] | None) -> set[str]:
    return {v.name if isinstance(v, Variable) else str(v) for v in items or ()}


def as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def differentiable(var: Variable | None) -> bool:
    return var is not None and np.dtype(var.dtype).kind == "f"


def producer_index(block: Block, name: str) -> int:
    for i in range(len(block.ops) - 1, -1, -1):
        if name in block.ops[i].output_arg_names:
            return i
    raise ProgramError(f"no op of block {block.idx} produces {name!r}: cannot differentiate it")


# 1. which variables can carry a gradient ------------------------------------------------------
def no_grad_names(block: Block, no_grad_set: Iterable[Any] | None,
                   keep: set[str] = frozenset()) -> set[str]:
    """The explicit set, every stop_gradient variable (data, frozen parameters) and every
    non-float variable; ``keep`` (the inputs of ``gradients``) are exempt."""
    names = var_names(no_grad_set)
    names |= {v.name for v in block.program.list_vars()
              if v.stop_gradient or not differentiable(v)}
    return names - keep


def requiring_grad(block: Block, ops: Sequence[Operator], no_grad: set[str],
                    seeds: set[str] | None) -> set[str]:
    """Variables whose value depends on something differentiated: the seeds (default:
    every leaf that is a trainable parameter or a non-persistable variable not in
    ``no_grad``), then, op by op, the outputs of ops that read one of them."""
    if seeds is None:
        produced = {n for op in ops for n in op.output_arg_names}
        seeds = {v.name for v in block.vars.values() if v.name not in produced
                 and (isinstance(v, Parameter) or not v.persistable)}
    req = set(seeds) - no_grad
    for op in ops:
        if any(n in req for n in op.input_arg_names):
            req.update(n for n in op.output_arg_names
                       if n not in no_grad and differentiable(block._find_var_recursive(n)))
    return req


# 2. which ops lie between those variables and the targets -----------------------------------
def ops_on_path(ops: Sequence[Operator], targets: Iterable[str],
                 req: set[str]) -> tuple[list[int], set[str]]:
    """Indices of ops that carry a gradient from ``targets`` back to a variable in ``req``,
    and the variables whose gradient is needed."""
    needed = set(targets)
    path = []
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if int(op.attr(OP_ROLE_KEY) or 0) & (OpRole.Backward | OpRole.Optimize):
            continue  # an earlier backward pass or update: not part of the forward
        if any(n in needed for n in op.output_arg_names) and \
                any(n in req for n in op.input_arg_names):
            path.append(i)
            needed.update(n for n in op.input_arg_names if n in req)
    path.reverse()
    return path, needed


def grad_descs(ops: Sequence[Operator], path: list[int], req: set[str]) -> list[OpDesc]:
    descs = []
    for i in reversed(path):
        op = ops[i]
        opdef = get_op_def(op.type)
        if opdef.grad is None:
            wanted = sorted(n for n in op.input_arg_names if n in req)
            raise ProgramError(f"op {i} ({op.type}) has no gradient, but its inputs {wanted} "
                               f"need one: put them in no_grad_set or set stop_gradient")
        no_grad = frozenset(n for n in op.input_arg_names if n not in req)
        for d in opdef.grad(op, no_grad):
            descs.append(OpDesc(d.type, {k: list(v) for k, v in d.inputs.items()},
                                {k: list(v) for k, v in d.outputs.items()}, dict(d.attrs)))
    return descs


# 3. accumulation: renamed partials and sums ------------------------------------------------
def is_grad_name(name: str) -> bool:
    return name.endswith(GRAD_SUFFIX)


class Accumulator:
    """Rewrites grad op descs in order so that several writers of one gradient write
    renamed partials, summed right before the gradient is first read (and at the end)."""

    def __init__(self, written: Iterable[str]) -> None:
        self.partials: dict[str, list[str]] = {g: [g] for g in written}
        self.writer: dict[str, tuple[dict, str, int]] = {}
        self.consumed: set[str] = set()
        self.renames: dict[str, int] = {}
        self.out: list[OpDesc] = []

    def _fresh(self, g: str) -> str:
        k = self.renames.get(g, 0)
        self.renames[g] = k + 1
        return f"{g}{RENAME_SUFFIX}{k}"

    def _flush(self, g: str) -> None:
        if len(self.partials.get(g, ())) > 1:
            self.out.append(OpDesc("sum", {"X": self.partials[g]}, {"Out": [g]}, {}))
            self.partials[g] = [g]

    def add(self, desc: OpDesc) -> None:
        for g in (n for names in desc.inputs.values() for n in names):
            if is_grad_name(g) and g not in self.partials:
                # A gradient nobody produced (an unused output of a multi-output op): zero.
                self.out.append(OpDesc("fill_zeros_like", {"X": [g[: -len(GRAD_SUFFIX)]]},
                                       {"Out": [g]}, {}))
                self.partials[g] = [g]
            self._flush(g)
            self.consumed.add(g)
        for slot, names in desc.outputs.items():
            for i, g in enumerate(names):
                if g != EMPTY_VAR_NAME:
                    self._write(g, desc.outputs, slot, i)
        self.out.append(desc)

    def _write(self, g: str, outputs: dict, slot: str, i: int) -> None:
        if g not in self.partials or g in self.consumed:
            # First write, or a write after the gradient was read: the value read belonged
            # to a later version of the variable (an in-place op); start afresh.
            self.partials[g] = [g]
            self.consumed.discard(g)
            self.writer[g] = (outputs, slot, i)
            return
        if self.partials[g] == [g] and g in self.writer:
            # The first writer wrote g itself; it becomes partial 0. (A seeded gradient has
            # no writer here and keeps its name: ``sum`` may write one of its inputs.)
            prev_outputs, prev_slot, prev_i = self.writer.pop(g)
            prev_outputs[prev_slot][prev_i] = self.partials[g][0] = self._fresh(g)
        outputs[slot][i] = self._fresh(g)
        self.partials[g].append(outputs[slot][i])

    def finish(self) -> list[OpDesc]:
        for g in list(self.partials):
            self._flush(g)
        return self.out


# 4. appending ------------------------------------------------------------------------------
def forward_name(grad_name: str) -> str:
    return grad_name.split(GRAD_SUFFIX, 1)[0]


def append_descs(block: Block, descs: list[OpDesc],
                  callbacks: Sequence[Callable] | None) -> None:
    for d in descs:
        for names in d.outputs.values():
            for g in names:
                fwd = block._find_var_recursive(forward_name(g)) if GRAD_SUFFIX in g else None
                if g != EMPTY_VAR_NAME and fwd is not None and not block.has_var(g):
                    block.create_var(name=g, shape=fwd.shape, dtype=fwd.dtype)
        op = block.append_op(d.type, d.inputs, d.outputs, d.attrs)
        for cb in callbacks or ():
            cb(block=block, context={"__current_op_desc__": op})


def backward_ops(block: Block, ops: Sequence[Operator], targets: list[str],
                  req: set[str], seeded: Iterable[str],
                  callbacks: Sequence[Callable] | None) -> set[str]:
    """Appends the grad ops of ``ops`` for ``targets`` (whose gradients the caller already
    wrote, named in ``seeded``); returns the gradient names written."""
    path, _ = ops_on_path(ops, targets, req)
    acc = Accumulator(seeded)
    for desc in grad_descs(ops, path, req):
        acc.add(desc)
    descs = acc.finish()
    append_descs(block, descs, callbacks)
    return set(acc.partials)


def check_loss(loss: Any) -> Variable:
    if not isinstance(loss, Variable):
        raise ProgramError(f"append_backward expects the loss Variable, got "
                           f"{type(loss).__name__}")
    if loss.shape is None or any(d < 0 for d in loss.shape):
        raise ProgramError(f"loss {loss.name!r} has shape {list(loss.shape or [])}: "
                           f"append_backward needs a loss of known shape (reduce it, e.g. "
                           f"with mean)")
    if not differentiable(loss):
        raise ProgramError(f"loss {loss.name!r} is {loss.dtype}: it must be a float")
    return loss


def trainable_parameters(block: Block, parameter_list: Iterable[Any] | None) -> list[Parameter]:
    if parameter_list is None:
        return [p for p in block.program.all_parameters() if p.trainable]
    params = []
    for name in (v.name if isinstance(v, Variable) else str(v) for v in parameter_list):
        p = block._find_var_recursive(name)
        if not isinstance(p, Parameter):
            raise ProgramError(f"parameter_list names {name!r}, which is not a parameter of "
                               f"the program")
        if p.trainable:
            params.append(p)
    return params


def mark_op_role_vars(block: Block, params_grads: list[tuple[Parameter, Variable]]) -> None:
    for p, g in params_grads:
        for op in reversed(block.ops):
            if g.name in op.output_arg_names:
                existing = op.attr(OP_ROLE_VAR_KEY) or []
                op._set_attr(OP_ROLE_VAR_KEY, [p.name, g.name, *existing])
                break
