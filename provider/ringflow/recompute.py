"""``append_backward(loss, checkpoints=...)``: the backward pass with recomputation
(Paddle's ``_append_backward_ops_with_checkpoints_``), in three named steps.

1. Segments: the checkpoints, ordered by the forward op that writes them, cut the forward
   ops into segments ``[0, c0] (c0, c1] ... (c_{m-1}, c_m]`` and the tail after ``c_m``.
2. Backward ops: the tail's grad ops, then per segment from the last: copies of the
   segment's forward ops that its grad ops need (role Backward, outputs renamed
   ``<name>.subprog_<k>``), then its grad ops reading those copies. The grad ops, their
   order and the gradient accumulation are exactly the plain backward's, so the gradients
   are bitwise the same; a random op draws the same numbers in its copy (same ``seed``
   attr: one without a seed gets the one its position gave it).
3. Shared buffers: ringflow's executor keeps every variable between runs (their arrays are
   reused), so a segment's activations would stay alive until the next step anyway. They
   are renamed to ``recompute_buf_<n>`` variables that every segment and every copy share,
   one per (dtype, shape) and position, so only one segment's activations are held at a
   time. A value that leaves its segment (a checkpoint, a value read by later segments or
   the tail) keeps its name, and so does anything an op may hand out as a view of it
   (ops not in ``_FRESH_OUTPUTS``). Gradient kernels never return views of forward values,
   so the copies are always shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .autodiff import (
    Accumulator,
    append_descs,
    check_loss,
    grad_descs,
    mark_op_role_vars,
    no_grad_names,
    ops_on_path,
    producer_index,
    requiring_grad,
    trainable_parameters,
)
from .errors import ConfigError
from .framework.program import Block, Operator, Variable
from .framework.registry import GRAD_SUFFIX, OpDesc, get_op_def, grad_var_name
from .framework.roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole

__all__ = ["append_backward_with_checkpoints"]

# Ops whose kernels write every output into an array of their own (never a view of an
# input), so a value they read may share a buffer with a later one.
_FRESH_OUTPUTS = frozenset({
    "matmul_v2", "mul", "elementwise_add", "elementwise_sub", "elementwise_mul",
    "elementwise_div", "elementwise_max", "elementwise_min", "relu", "tanh", "sigmoid",
    "gelu", "exp", "log", "sqrt", "square", "scale", "cast", "softmax", "layer_norm",
    "lookup_table_v2", "c_embedding", "c_identity", "mp_allreduce_sum", "c_concat",
    "c_split", "c_allgather", "sum", "mean", "reduce_sum", "reduce_mean", "concat",
    "softmax_with_cross_entropy", "c_softmax_with_cross_entropy", "fill_constant",
    "assign", "tril_triu", "fused_gemm_epilogue",
})
_COPY_SUFFIX = ".subprog_"


def _is_forward(op: Operator) -> bool:
    return not int(op.attr(OP_ROLE_KEY) or 0) & (OpRole.Backward | OpRole.Optimize)


# 1. segments --------------------------------------------------------------------------------
def checkpoint_names(block: Block, ops: Sequence[Operator], checkpoints: Iterable[Any],
                     ) -> tuple[list[str], dict[str, int]]:
    """The checkpoints' names, ordered by the forward op that writes them, and that op's
    index; a name that is not a variable, or that no forward op before the loss writes,
    is a ConfigError."""
    names = list(dict.fromkeys(c.name if isinstance(c, Variable) else str(c)
                               for c in checkpoints))
    where: dict[str, int] = {}
    for name in names:
        if block._find_var_recursive(name) is None:
            raise ConfigError(f"recompute: checkpoint {name!r} is not a variable of the "
                              f"program")
        writers = [i for i, op in enumerate(ops) if _is_forward(op)
                   and name in op.output_arg_names]
        if not writers:
            raise ConfigError(f"recompute: checkpoint {name!r} is not computed by a forward "
                              f"op before the loss")
        where[name] = writers[-1]
    return sorted(names, key=where.__getitem__), where


def segments_of(where: dict[str, int], names: list[str]) -> list[tuple[int, int]]:
    """[start, stop) op ranges of the recomputed segments, one per checkpoint."""
    bounds = [where[n] + 1 for n in names]
    return [(lo, hi) for lo, hi in zip([0, *bounds[:-1]], bounds) if hi > lo]


# 2. backward ops ------------------------------------------------------------------------------
def _reads(descs: Iterable[OpDesc]) -> set[str]:
    return {n for d in descs for names in d.inputs.values() for n in names
            if GRAD_SUFFIX not in n}


def _copies(block: Block, ops: Sequence[Operator], span: tuple[int, int], k: int,
            needed: set[str], keep: set[str]) -> tuple[list[OpDesc], dict[str, str]]:
    """Copies of the segment's forward ops that compute ``needed`` (in forward order) and
    the renames of every value they write (a checkpoint one writes again goes to its copy
    too, which nothing reads: the checkpoint itself stays as the forward left it)."""
    lo, hi = span
    seg = [(i, op) for i, op in enumerate(ops[lo:hi], lo) if _is_forward(op)]
    produced = {n for _, op in seg for n in op.output_arg_names}
    want = {n for n in needed if n in produced and n not in keep}
    chosen = []
    for i, op in reversed(seg):
        if want & set(op.output_arg_names):
            chosen.append((i, op))
            want.update(n for n in op.input_arg_names if n in produced and n not in keep)
    chosen.reverse()
    renames = {n: f"{n}{_COPY_SUFFIX}{k}" for _, op in chosen for n in op.output_arg_names}
    descs = []
    for i, op in chosen:
        _fix_seed(op, i)
        attrs = {key: v for key, v in op.attrs.items() if key != OP_ROLE_VAR_KEY}
        attrs[OP_ROLE_KEY] = int(OpRole.Backward)
        descs.append(OpDesc(op.type, _renamed(op.inputs, renames), _renamed(op.outputs, renames),
                            attrs))
    for old, new in renames.items():
        var = block._find_var_recursive(old)
        block.create_var(name=new, shape=var.shape, dtype=var.dtype,
                         stop_gradient=var.stop_gradient)
    return descs, renames


def _renamed(slots: dict[str, list[str]], renames: dict[str, str]) -> dict[str, list[str]]:
    return {slot: [renames.get(n, n) for n in names] for slot, names in slots.items()}


def _fix_seed(op: Operator, index: int) -> None:
    # A random op without a seed draws from its position (KernelContext.rng); its copy sits
    # elsewhere, so both get that position as their seed: the same numbers as before.
    if "seed" in get_op_def(op.type).attrs and not op.attr("seed"):
        op._set_attr("seed", 1 << 32 | index)


def _recompute_descs(block: Block, ops: Sequence[Operator], spans: list[tuple[int, int]],
                     loss: Variable, req: set[str], keep: set[str],
                     ) -> tuple[list[OpDesc], set[str], list[dict[str, str]]]:
    """The backward op descs; the gradient names written; per segment, its renames."""
    loss_grad = grad_var_name(loss.name)
    path, _ = ops_on_path(ops, [loss.name], req)
    acc = Accumulator([loss_grad])
    tail_start = spans[-1][1] if spans else 0
    regions = [(tail_start, len(ops), None)] + [(lo, hi, k) for k, (lo, hi)
                                                  in reversed(list(enumerate(spans)))]
    renames_by_segment: list[dict[str, str]] = [{} for _ in spans]
    for lo, hi, k in regions:
        mark = len(acc.out)
        for desc in grad_descs(ops, [i for i in path if lo <= i < hi], req):
            acc.add(desc)
        if k is None:
            continue
        emitted = acc.out[mark:]
        copies, renames = _copies(block, ops, (lo, hi), k, _reads(emitted), keep)
        reading = {n: c for n, c in renames.items() if n not in keep}
        for desc in emitted:
            for names in desc.inputs.values():
                names[:] = [reading.get(n, n) for n in names]
        acc.out[mark:mark] = copies
        renames_by_segment[k] = renames
    return acc.finish(), set(acc.partials), renames_by_segment


def append_backward_with_checkpoints(loss: Variable, checkpoints: Iterable[Any],
                                     parameter_list: Iterable[Any] | None = None,
                                     no_grad_set: Iterable[Any] | None = None,
                                     callbacks=None) -> list[tuple[Any, Variable]]:
    """``append_backward`` whose segments between ``checkpoints`` are recomputed in the
    backward pass (see the module docstring); returns [(parameter, gradient)]."""
    loss = check_loss(loss)
    block, program = loss.block, loss.block.program
    loss_idx = producer_index(block, loss.name)
    loss_op = block.ops[loss_idx]
    loss_op._set_attr(OP_ROLE_KEY, int(loss_op.attr(OP_ROLE_KEY) or 0) | int(OpRole.Loss))
    ops = block.ops[: loss_idx + 1]
    names, where = checkpoint_names(block, ops, checkpoints)
    spans = segments_of(where, names)
    req = requiring_grad(block, ops, no_grad_names(block, no_grad_set), None)
    keep = {*names, loss.name}
    loss_grad = grad_var_name(loss.name)
    with program._backward_role_guard():
        block.create_var(name=loss_grad, shape=loss.shape, dtype=loss.dtype)
        block.append_op("fill_constant", outputs={"Out": [loss_grad]},
                        attrs={"shape": list(loss.shape), "value": 1.0, "dtype": loss.dtype,
                               OP_ROLE_KEY: int(OpRole.Backward | OpRole.Loss)})
        descs, written, renames = _recompute_descs(block, ops, spans, loss, req, keep)
        append_descs(block, descs, callbacks)
    params_grads = [(p, block.var(grad_var_name(p.name)))
                    for p in trainable_parameters(block, parameter_list)
                    if grad_var_name(p.name) in written]
    mark_op_role_vars(block, params_grads)
    from .recompute_buffers import share_segment_buffers

    share_segment_buffers(block, spans, renames, keep, _FRESH_OUTPUTS)
    return params_grads
