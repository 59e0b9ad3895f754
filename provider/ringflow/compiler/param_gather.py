"""The parameter all-gather of sharding (part of ``fuse_all_reduce_ops``).

ShardingOptimizer ends the step with a ``broadcast`` of every parameter from the rank that
updated it, owners in rank order along the parameters. A run of such broadcasts (one ring,
one dtype, in place) becomes one step that all-gathers a flat buffer whose views are the
parameters: ``all_gather_v``, each owner's parameters one range. On a ring of one host the
buffer lives in the ring's shared memory (``comm.shared_array``), so each rank copies its
peers' updated parameters straight from their buffers; the fused update step then reads
and writes the owned parameters where they lie (fuse_optimizer.py adopts arrays that are
already end to end).
"""

from __future__ import annotations

import weakref

import numpy as np

from ..distributed.shard_layout import shard_bounds
from ..framework.program import Operator
from ..framework.roles import OP_ROLE_KEY, OpRole
from .steps import Step

_BROADCAST = "broadcast"


def fuse(steps: list[Step], block) -> list[Step]:
    """The steps with every run of two or more gatherable broadcasts as one step."""
    out: list[Step] = []
    run: list[Step] = []

    def flush() -> None:
        out.extend([_gather_step(run, block)] if len(run) > 1 else run)
        run.clear()

    for step in steps:
        if not _gatherable(step.op, block):
            flush()
            out.append(step)
            continue
        if run and not _continues(run[-1].op, step.op, block):
            flush()
        run.append(step)
    flush()
    return out


def _gatherable(op: Operator, block) -> bool:
    """A broadcast of a parameter in place, in the optimizer section."""
    if op.type != _BROADCAST or op.input("X") != op.output("Out"):
        return False
    var = block._find_var_recursive(op.input("X")[0])
    return bool(int(op.attr(OP_ROLE_KEY) or 0) & OpRole.Optimize) and var is not None \
        and getattr(var, "trainable", False) and var.dtype is not None


def _continues(last: Operator, op: Operator, block) -> bool:
    """Whether broadcast ``op`` joins a run that ends with ``last``."""
    dtype = block._find_var_recursive(op.input("X")[0]).dtype
    return (op.attr("ring_id") == last.attr("ring_id") and op.attr("root") >= last.attr("root")
            and dtype == block._find_var_recursive(last.input("X")[0]).dtype)


def _gather_step(run: list[Step], block) -> Step:
    names = [s.op.input("X")[0] for s in run]
    first = run[0].op
    op = Operator(block, "param_allgather", {"X": names}, {"Out": list(names)},
                  {"ring_id": first.attr("ring_id"), "roots": [s.op.attr("root") for s in run],
                   OP_ROLE_KEY: int(OpRole.Optimize)})
    return Step(op, ParamGather(names, [s.op.attr("root") for s in run], first.attr("ring_id"),
                                block), run[0].index, tuple(s.index for s in run))


class ParamGather:
    """The kernel: parameters as views of one flat buffer per scope, all-gathered."""

    def __init__(self, names: list[str], roots: list[int], ring_id: int, block) -> None:
        self.names, self.roots, self.ring_id = names, roots, int(ring_id)
        self.shapes = [tuple(int(d) for d in block._find_var_recursive(n).shape) for n in names]
        self.dtype = np.dtype(block._find_var_recursive(names[0]).dtype)
        self._buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, ctx) -> None:
        from ..distributed.collective.registry import get_ring

        comm = get_ring(self.ring_id)
        flat = self._bind(ctx, comm)
        comm.all_gather_v(flat, shard_bounds([int(np.prod(s)) for s in self.shapes],
                                             self.roots, comm.nranks))

    def _bind(self, ctx, comm) -> np.ndarray:
        """The scope's flat buffer, every parameter a view into it (a parameter put into
        the scope in place of its view, e.g. by a checkpoint load, is copied in)."""
        buffers = self._buffers.get(ctx.scope)
        if buffers is None:
            sizes = [int(np.prod(s)) for s in self.shapes]
            flat = comm.shared_array(sum(sizes), self.dtype)
            starts = np.cumsum([0, *sizes])
            views = [flat[a:b].reshape(s) for a, b, s in zip(starts, starts[1:], self.shapes)]
            buffers = self._buffers[ctx.scope] = (flat, views)
        flat, views = buffers
        values = ctx.scope._vars
        for name, view in zip(self.names, views):
            current = values.get(name)
            if current is not view:
                if current is None:
                    ctx.input("X", self.names.index(name))  # the executor's error
                np.copyto(view, current.reshape(view.shape))
                values[name] = view
                ctx.executor.adopt(name, view)
        return flat
