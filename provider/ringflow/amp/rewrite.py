"""The mixed-precision rewrite passes of Paddle's fp16_utils.py (AMP level O1):

``rewrite_program`` (before backward) sorts the forward ops into float16 and float32 ones
by the lists and inserts ``cast`` ops where a value crosses: a float32 input of a float16
op is read through ``<name>.cast_fp16``, a float16 input of a float32 op through
``<name>.cast_fp32``; parameters stay float32 (the master weights) and each float16 use
reads a cast. Backward then differentiates the casts like any op: the gradient of a cast
parameter arrives in float16 and is cast back to float32.

``update_role_var_grad`` (after backward) moves each such gradient's cast back to float32
to the end of the block as an optimizer op and names the float16 gradient in the
``op_role_var`` of the op that writes it, so a data-parallel all-reduce inserted after that
op moves float16: half the bytes.
"""

from __future__ import annotations

from ..errors import ProgramError
from ..framework.program import Block, Operator
from ..framework.roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole
from .lists import AutoMixedPrecisionLists

FP16, FP32 = "float16", "float32"
_SUFFIX = {FP16: ".cast_fp16", FP32: ".cast_fp32"}


def _producer(block: Block, op: Operator, name: str) -> Operator | None:
    """The last op before ``op`` that writes ``name`` (None: a parameter, data or state)."""
    found = None
    for other in block.ops:
        if other is op:
            break
        if name in other.output_arg_names:
            found = other
    return found


def classify(block: Block, lists: AutoMixedPrecisionLists) -> tuple[set[int], set[int]]:
    """(ids of the ops that compute in float16, ids of those that compute in float32)."""
    white: set[int] = set()
    black: set[int] = set()
    for op in block.ops:
        if op.type in lists.black_list:
            black.add(id(op))
        elif op.type in lists.white_list:
            white.add(id(op))
        elif op.type in lists.gray_list:
            feeders = [p for n in op.input_arg_names
                       if (p := _producer(block, op, n)) is not None]
            if any(id(p) in black or p.type in lists.black_list for p in feeders):
                black.add(id(op))
            elif any(id(p) in white or p.type in lists.white_list for p in feeders):
                white.add(id(op))
        else:   # an op in no list computes in float32, for numerical safety
            black.add(id(op))
    return white, black


def rewrite_program(block: Block, lists: AutoMixedPrecisionLists) -> list[Operator]:
    """Inserts the casts of AMP O1 into the forward ops of ``block``; returns them."""
    white, black = classify(block, lists)
    casts: list[Operator] = []
    for op in list(block.ops):
        if id(op) in white:
            casts += _cast_inputs(block, op, FP32, FP16)
            _outputs_to(block, op, FP16)
        elif id(op) in black:
            casts += _cast_inputs(block, op, FP16, FP32)
    return casts


def _keep_fp32_input(op: Operator, slot: str) -> bool:
    # Paddle keeps a normalisation's statistics and affine parameters in float32
    return op.type in ("batch_norm", "layer_norm") and slot != "X"


def _cast_inputs(block: Block, op: Operator, src: str, dst: str) -> list[Operator]:
    """Reads every ``src`` input of ``op`` through a ``dst`` cast of it (made right before
    ``op``, or the one an earlier op already reads)."""
    made = []
    for slot, names in op.inputs.items():
        if src == FP32 and _keep_fp32_input(op, slot):
            continue
        for name in dict.fromkeys(names):
            var = block._find_var_recursive(name)
            if var is None or var.dtype != src:
                continue
            cast_name = name + _SUFFIX[dst]
            cast_var = block.vars.get(cast_name)
            if cast_var is None or cast_var.dtype != dst:
                cast_var = block.create_var(name=cast_name, shape=var.shape, dtype=dst,
                                            stop_gradient=var.stop_gradient)
                made.append(block.insert_op_before(
                    op, "cast", inputs={"X": [name]}, outputs={"Out": [cast_name]},
                    attrs={"in_dtype": src, "out_dtype": dst,
                           OP_ROLE_KEY: int(op.attr(OP_ROLE_KEY) or 0)}))
            op._rename_input(name, cast_name)
    return made


def _outputs_to(block: Block, op: Operator, dtype: str) -> None:
    """A float16 op's float32 outputs become float16 (a normalisation's statistics stay)."""
    for slot, names in op.outputs.items():
        if op.type in ("batch_norm", "layer_norm") and slot != "Y":
            continue
        for name in names:
            var = block._find_var_recursive(name)
            if var is not None and var.dtype == FP32 and not var.persistable:
                var.dtype = dtype
    if op.has_attr("out_dtype") and op.attr("out_dtype") == FP32:
        op._set_attr("out_dtype", dtype)
    block.program._bump()


def update_role_var_grad(block: Block, params_grads) -> list[Operator]:
    """For each float32 gradient written by a ``cast`` of a float16 gradient: the op that
    writes the float16 one gets [param, fp16 grad] prepended to its ``op_role_var``, and the
    cast (role Optimize, no op_role_var) moves to the end of the block, after every
    backward op. Returns the moved casts."""
    moved = []
    for param, grad in params_grads:
        writer = next((op for op in reversed(block.ops) if grad.name in op.output_arg_names),
                      None)
        if writer is None or writer.type != "cast" or grad.dtype != FP32:
            continue
        role = int(writer.attr(OP_ROLE_KEY) or 0)
        if not role & OpRole.Backward:
            raise ProgramError(f"op {block.index_of(writer)} (cast) writes the gradient "
                               f"{grad.name!r} but is not a backward op (op_role {role})")
        fp16_grad = writer.input("X")[0]
        source = _producer(block, writer, fp16_grad)
        if source is None:
            continue
        source._set_attr(OP_ROLE_VAR_KEY,
                         [param.name, fp16_grad, *(source.attr(OP_ROLE_VAR_KEY) or [])])
        attrs = {k: v for k, v in writer.attrs.items() if k != OP_ROLE_VAR_KEY}
        attrs[OP_ROLE_KEY] = int(OpRole.Optimize)
        block._remove_op(block.index_of(writer))
        moved.append(block.append_op("cast", inputs={"X": [fp16_grad]},
                                     outputs={"Out": [grad.name]}, attrs=attrs))
    return moved
