"""The fuse_all_optimizer_ops pass (Paddle's ``BuildStrategy`` switch of that name, which
runs its fuse_adam_op_pass, fuse_momentum_op_pass and fuse_sgd_op_pass).

Where the optimizer section runs update ops one after another (with, between them, only
waits for the gradient buckets they read), the update ops of one type, one learning rate,
one dtype and the same attributes become one step. Its op is the same update op with every
parameter in each slot (``adam(Param=[a, b, ...], Grad=[...], ...)``); the window's bucket
waits go before it, so it starts when all the gradients it reads are reduced.

Storage. At its first run in a scope the step lays its parameters, and their moments or
velocities, end to end in one flat buffer per slot, and the scope's arrays become views into
them (the values copied in once; the executor adopts the views: its one ownership rule).
Parameters are laid out in the order their gradients lie in memory, so that where gradients
are one flat buffer already (a gradient bucket's) a run of them is read as that buffer;
gradients that are separate arrays the executor made are laid end to end the same way at
the first run (Paddle's coalesce_grad_tensor), so the next backward pass writes into views.
A span is a run of parameters whose gradients lie end to end: Adam, AdamW, momentum and SGD
update a span in one sweep of cache-sized chunks (the same arithmetic, ops/update_math.py,
so the results are bitwise those of the unfused ops); Lamb and LARS take one norm per
parameter, so they sweep per parameter, and on a tensor-parallel ring they all-reduce every
parameter's partial sums in one call instead of one per parameter.

An array put into the scope in place of a view (a checkpoint load, a user's assignment, an
AMP step that was skipped and put the old state back) is copied into the buffer at the next
run, and the scope gets the view back; gradients that stop lying end to end (a kernel that
hands out a new array) are read where they are, a span of their own.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..framework.program import Operator
from ..framework.roles import OP_ROLE_VAR_KEY
from ..ops.update_rules import RULES
from .steps import Step

_WAIT = "bucket_wait"


def fuse(steps: list[Step], block) -> list[Step]:
    """The steps with every group of two or more fusable update ops as one step."""
    out: list[Step] = []
    pos = 0
    while pos < len(steps):
        end = pos
        while end < len(steps) and (steps[end].op.type == _WAIT
                                    or _fusable(steps[end].op, block)):
            end += 1
        if end == pos:
            out.append(steps[pos])
            pos += 1
            continue
        out.extend(_fuse_window(steps[pos:end], block))
        pos = end
    return out


def _fusable(op: Operator, block) -> bool:
    """An update op of a known kind whose every slot holds one variable, writing its state
    back in place, all of one dtype."""
    kind = RULES.get(op.type)
    if kind is None:
        return False
    ins = ("Param", "Grad", "LearningRate", *kind.state[1:], *kind.pows)
    if set(op.inputs) != set(ins) or any(len(op.inputs[s]) != 1 for s in ins):
        return False
    if set(op.outputs) != {f"{s}Out" for s in (*kind.state, *kind.pows)}:
        return False
    if any(op.outputs[f"{s}Out"] != op.inputs[s] for s in (*kind.state, *kind.pows)):
        return False
    dtypes = {_dtype(block, op.inputs[s][0]) for s in ("Param", "Grad", *kind.state)}
    return len(dtypes) == 1 and None not in dtypes


def _dtype(block, name: str):
    var = block._find_var_recursive(name)
    return None if var is None or var.dtype is None else np.dtype(var.dtype)


def _fuse_window(window: list[Step], block) -> list[Step]:
    updates = [s for s in window if s.op.type != _WAIT]
    written = [n for s in updates for n in s.op.output_arg_names]
    # each op touches only its own state: none reads what another writes, so their order
    # within the window does not matter
    if len(written) != len(set(written)) or any(
            (set(s.op.input_arg_names) & set(written)) - set(s.op.output_arg_names)
            for s in updates):
        return window
    groups: dict[tuple, list[Step]] = {}
    for step in updates:
        groups.setdefault(_key(step.op, block), []).append(step)
    fused = [_fused_step(g, block) if len(g) > 1 else g[0] for g in groups.values()]
    return [s for s in window if s.op.type == _WAIT] + fused


def _key(op: Operator, block) -> tuple:
    attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items() if k != OP_ROLE_VAR_KEY))
    return (op.type, op.inputs["LearningRate"][0], str(_dtype(block, op.inputs["Param"][0])),
            attrs)


def _fused_step(group: list[Step], block) -> Step:
    first = group[0].op
    inputs = {slot: [s.op.inputs[slot][0] for s in group] for slot in first.inputs}
    inputs["LearningRate"] = first.inputs["LearningRate"]
    outputs = {slot: [s.op.outputs[slot][0] for s in group] for slot in first.outputs}
    attrs = {k: v for k, v in first.attrs.items() if k != OP_ROLE_VAR_KEY}
    attrs[OP_ROLE_VAR_KEY] = [n for s in group for n in s.op.attr(OP_ROLE_VAR_KEY) or ()]
    op = Operator(block, first.type, inputs, outputs, attrs)
    return Step(op, FusedUpdate(op), group[0].index, tuple(s.index for s in group))


# ------------------------------------------------------------------------------- the kernel
class FusedUpdate:
    """The kernel of a fused update step: the storage here, the sweep its rule's
    (ops/update_rules.py)."""

    def __init__(self, op: Operator) -> None:
        self.type, self.kind = op.type, RULES[op.type]
        self.params, self.grads = list(op.inputs["Param"]), list(op.inputs["Grad"])
        self.state = {slot: list(op.inputs[slot]) for slot in self.kind.state}
        self.key = (op.type, tuple(self.params))

    def __call__(self, ctx) -> None:
        flat = self._flat(ctx)
        self.kind.sweep(self, ctx, flat, flat.spans(ctx, self.grads))

    def _flat(self, ctx) -> _Flat:
        store = ctx.executor.flat_state(ctx.scope)
        flat = store.get(self.key)
        values = ctx.scope._vars
        if flat is None or not flat.fits(ctx) or flat.params_moved(ctx, values, self.params):
            flat = store[self.key] = _Flat(ctx, self)
        for slot, names in self.state.items():
            current = [values.get(n) for n in names]
            if any(a is not v for a, v in zip(current, flat.views[slot])):
                flat.adopt(ctx, slot, names, current)
            for name, view in zip(names, flat.views[slot]):
                current = values.get(name)
                if current is not view:
                    if current is None:
                        ctx.input(slot, names.index(name))  # the executor's error
                    np.copyto(view, current.reshape(view.shape))
                    values[name] = view
                    ctx.executor.adopt(name, view)
        return flat


# ------------------------------------------------------------------------------ the storage
def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class _Flat:
    """One fused step's parameters and state, end to end in one buffer per slot, in
    ``order`` (positions in the op's slot lists); ``views[slot][i]`` is the array of the
    i-th variable of ``slot``."""

    def __init__(self, ctx, fused: FusedUpdate) -> None:
        params = ctx.inputs("Param")
        shapes = [p.shape for p in params]
        self.shapes, self.dtype = shapes, params[0].dtype
        for slot in ("Grad", *fused.kind.state[1:]):
            for i, arr in enumerate(ctx.inputs(slot)):
                if arr.shape != shapes[i] or arr.dtype != self.dtype:
                    raise ValueError(f"{fused.type}: {slot} {ctx.op.inputs[slot][i]!r} is "
                                     f"{arr.dtype}{list(arr.shape)}, its parameter "
                                     f"{fused.params[i]!r} {self.dtype}{list(shapes[i])}")
        grads = _coalesce(ctx, fused.grads)
        if _one_buffer(params):   # gathered parameters (sharding): the order they lie in
            self.order = sorted(range(len(params)), key=lambda i: _address(params[i]))
        else:
            roots: dict[int, int] = {}
            rank = [roots.setdefault(id(_root(g)), len(roots)) for g in grads]
            self.order = sorted(range(len(params)),
                                key=lambda i: (rank[i], _address(grads[i])))
        sizes = [int(np.prod(s)) for s in shapes]
        self.starts = [0]
        for i in self.order:
            self.starts.append(self.starts[-1] + sizes[i])
        self.buffers: dict[str, np.ndarray] = {}
        self.views: dict[str, list[np.ndarray]] = {}
        at = {i: self.starts[k] for k, i in enumerate(self.order)}
        for slot, names in fused.state.items():
            buf = self.buffers[slot] = np.empty(self.starts[-1], self.dtype)
            self.views[slot] = [buf[at[i]:at[i] + sizes[i]].reshape(shapes[i])
                                for i in range(len(names))]
        self._grads: list[np.ndarray] = []
        self._spans: list[tuple[int, int, np.ndarray]] = []

    def adopt(self, ctx, slot: str, names: list[str], arrays: list) -> None:
        """Makes ``arrays`` (the scope's, one per variable of ``slot``) the slot's storage
        when the executor owns them and they lie end to end in ``order`` already (sharding's
        gathered parameters: compiler/param_gather.py), so neither side copies each step."""
        ordered = [arrays[i] for i in self.order]
        if any(a is None or a.dtype != self.dtype or a.shape != self.shapes[i]
               or not ctx.executor.owns(names[i], a) for i, a in enumerate(arrays)):
            return
        if not all(_follows(a, b) for a, b in itertools.pairwise(ordered)) \
                or not ordered[0].flags.c_contiguous:
            return
        self.buffers[slot] = _joined(ordered)
        self.views[slot] = list(arrays)

    def params_moved(self, ctx, values, names: list[str]) -> bool:
        """Whether the parameters now lie in one buffer of someone else's (sharding's
        all-gather made them views of its own): then the layout follows theirs."""
        current = [values.get(n) for n in names]
        return any(a is not v for a, v in zip(current, self.views["Param"])) \
            and _one_buffer(current) and all(ctx.executor.owns(n, a)
                                             for n, a in zip(names, current))

    def fits(self, ctx) -> bool:
        """Whether the parameters still have the shapes and dtype laid out."""
        params = ctx.inputs("Param")
        return [p.shape for p in params] == self.shapes and all(
            p.dtype == self.dtype for p in params)

    def part(self, slot: str, lo: int, hi: int) -> np.ndarray:
        """Slot ``slot`` of the variables at positions ``lo:hi`` of the order, flat."""
        return self.buffers[slot][self.starts[lo]:self.starts[hi]]

    def grad_of(self, span_grad: np.ndarray, lo: int, k: int) -> np.ndarray:
        """The gradient at position ``k`` of the order, in the span that starts at ``lo``."""
        base = self.starts[lo]
        return span_grad[self.starts[k] - base:self.starts[k + 1] - base]

    def spans(self, ctx, names: list[str]) -> list[tuple[int, int, np.ndarray]]:
        """(first, end) positions of the order whose gradients lie end to end, and those
        gradients as one flat array."""
        grads = [ctx.scope._vars.get(n) for n in names]
        if len(grads) == len(self._grads) and all(a is b for a, b in zip(grads, self._grads)):
            return self._spans
        grads = ctx.inputs("Grad")  # the executor's error for a missing one
        for i, g in enumerate(grads):
            if g.shape != self.shapes[i]:
                raise ValueError(f"{ctx.op.type}: Grad {names[i]!r} has shape "
                                 f"{list(g.shape)}, its parameter {list(self.shapes[i])}")
        spans, lo = [], 0
        for k in range(1, len(self.order) + 1):
            if k < len(self.order) and _follows(grads[self.order[k - 1]],
                                                grads[self.order[k]]):
                continue
            spans.append((lo, k, _joined([grads[i] for i in self.order[lo:k]])))
            lo = k
        self._grads, self._spans = grads, spans
        return spans


def _one_buffer(arrays: list) -> bool:
    """Whether ``arrays`` are views of one buffer that lie end to end in address order."""
    if any(not isinstance(a, np.ndarray) for a in arrays) or len(arrays) < 2 \
            or len({id(_root(a)) for a in arrays}) != 1 or arrays[0].base is None:
        return False
    ordered = sorted(arrays, key=_address)
    return all(_follows(a, b) for a, b in itertools.pairwise(ordered))


def _follows(a: np.ndarray, b: np.ndarray) -> bool:
    root = _root(a)
    return (a.flags.c_contiguous and b.flags.c_contiguous and root.flags.c_contiguous
            and root is _root(b) and _address(a) + a.nbytes == _address(b))


def _joined(grads: list[np.ndarray]) -> np.ndarray:
    """Gradients that lie end to end (``_follows``) as one flat array, without a copy."""
    if len(grads) == 1:
        return np.ascontiguousarray(grads[0]).reshape(-1)
    root = _root(grads[0])
    start = _address(grads[0]) - _address(root)
    nbytes = sum(g.nbytes for g in grads)
    return root.reshape(-1).view(np.uint8)[start:start + nbytes].view(grads[0].dtype)


def _coalesce(ctx, names: list[str]) -> list[np.ndarray]:
    """The gradients, those that are whole arrays of their own the executor made laid end
    to end in one new buffer (the scope gets views, the executor adopts them)."""
    values, executor = ctx.scope._vars, ctx.executor
    grads = ctx.inputs("Grad")
    alone = [i for i, g in enumerate(grads) if g.base is None and g.flags.c_contiguous
             and executor.owns(names[i], g)]
    if len(alone) < 2:
        return grads
    buf = np.empty(sum(grads[i].size for i in alone), grads[alone[0]].dtype)
    at = 0
    for i in alone:
        view = buf[at:at + grads[i].size].reshape(grads[i].shape)
        np.copyto(view, grads[i])
        at += grads[i].size
        values[names[i]] = grads[i] = view
        executor.adopt(names[i], view)
    return grads
