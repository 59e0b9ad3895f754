"""Step 3 of recompute (see ``recompute.py``): the activations of every recomputed segment,
and their copies in the backward pass, share one set of variables, so ringflow's executor
(which keeps every variable's array between runs) holds one segment's worth of them.

A value is shared when it cannot be needed after its segment: it is written by a forward
op of the segment, read by no op outside it (its gradient ops read the copy), is not a
checkpoint, the loss, data or persistable, and no value that is read outside the segment
may be a view of it. The n-th shared value of a (dtype, shape) in a segment, and the n-th
copy of that kind, all use variable ``recompute_buf_<m>``: their lifetimes never overlap,
because segments run one after the other in the forward pass and again, one at a time, in
the backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from .framework.program import Block, Operator
from .framework.roles import OP_ROLE_KEY, OpRole


def _readers(block: Block) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for i, op in enumerate(block.ops):
        for name in dict.fromkeys(op.input_arg_names):
            found.setdefault(name, []).append(i)
    return found


def _written_in_order(block: Block, ops: Sequence[tuple[int, Operator]],
                      exclude: set[str]) -> list[str]:
    names: dict[str, None] = {}
    for _, op in ops:
        for name in op.output_arg_names:
            var = block._find_var_recursive(name)
            if (name not in exclude and var is not None and var.shape is not None
                    and not (var.persistable or var.is_data)):
                names.setdefault(name)
    return list(names)


def _views_of_escaping(ops: Sequence[tuple[int, Operator]], escaping: set[str],
                       produced: set[str], fresh: frozenset[str]) -> set[str]:
    """``escaping`` plus every value an escaping one may be a view of (through ops that may
    hand out views of their inputs), followed back through the segment."""
    unsafe = set(escaping)
    for _, op in reversed(ops):
        if op.type not in fresh and unsafe & set(op.output_arg_names):
            unsafe.update(n for n in op.input_arg_names if n in produced)
    return unsafe


class _Pool:
    """The shared variables, by (dtype, shape): ``take`` hands out the n-th of a kind."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.slots: dict[tuple, list[str]] = {}

    def assign(self, names: list[str]) -> dict[str, str]:
        used: dict[tuple, int] = {}
        plan = {}
        for name in names:
            var = self.block._find_var_recursive(name)
            kind = (var.dtype, tuple(var.shape))
            n = used.get(kind, 0)
            used[kind] = n + 1
            slots = self.slots.setdefault(kind, [])
            if n == len(slots):
                slot = self.block.program.unique_name("recompute_buf")
                self.block.create_var(name=slot, shape=var.shape, dtype=var.dtype,
                                      stop_gradient=True)
                slots.append(slot)
            plan[name] = slots[n]
        return plan


def share_segment_buffers(block: Block, spans: list[tuple[int, int]],
                          renames: list[dict[str, str]], keep: set[str],
                          fresh: frozenset[str]) -> dict[str, str]:
    """Renames the shareable values of each segment ``spans[k]`` (forward op ranges) and
    the copies ``renames[k]`` made of them to the shared variables; returns the renames."""
    readers = _readers(block)
    pool = _Pool(block)
    plan: dict[str, str] = {}
    for (lo, hi), copies in zip(spans, renames):
        seg = [(i, op) for i, op in enumerate(block.ops[lo:hi], lo)
               if not int(op.attr(OP_ROLE_KEY) or 0) & (OpRole.Backward | OpRole.Optimize)]
        values = _written_in_order(block, seg, keep)
        escaping = {n for n in values if any(not lo <= r < hi for r in readers.get(n, ()))}
        unsafe = _views_of_escaping(seg, escaping, set(values), fresh)
        plan.update(pool.assign([n for n in values if n not in unsafe]))
        plan.update(pool.assign([copies[n] for n in values if n in copies]))
    _rename_everywhere(block, plan)
    return plan


def _rename_everywhere(block: Block, plan: dict[str, str]) -> None:
    for op in block.ops:
        for old in [n for n in dict.fromkeys([*op.input_arg_names, *op.output_arg_names])
                    if n in plan]:
            block.rename_var_in_op(op, old, plan[old])
    for old in plan:
        block._remove_var(old)
