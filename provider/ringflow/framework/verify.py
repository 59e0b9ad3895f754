"""``verify(program)``: explain what is wrong with a whole program, op by op.

Checked for every op, in order: its type is registered; its slots match the op
definition; every input is a parameter, a persistable or data variable, or the output of
an earlier op; its attrs have the types of the definition's defaults (and ``op_role`` is
an int); re-running its shape inference gives the output shapes and dtypes the block
declares (-1 matches any size). The error names the block, op index, type and variable,
and prints the ops around.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ProgramError, RingflowError
from .printer import op_to_string
from .program import Block, Operator, Program
from .registry import EMPTY_VAR_NAME, ShapeContext, get_op_def, has_op_def, slot_errors
from .roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY

__all__ = ["verify"]

CONTEXT_OPS = 2  # ops printed before and after the bad one


def verify(program: Program) -> None:
    """Returns None if every block is well formed; raises ProgramError at the first
    problem, naming the op and the variable and printing the neighbouring ops."""
    if not isinstance(program, Program):
        raise ProgramError(f"verify expects a Program, got {type(program).__name__}")
    for block in program.blocks:
        available = _given_values(block)
        for i, op in enumerate(block.ops):
            problem = _op_problem(block, op, available)
            if problem is not None:
                raise ProgramError(_explain(block, i, problem))
            available.update(op.output_arg_names)


def _given_values(block: Block) -> set[str]:
    """Variables that have a value before the block's first op: parameters and other
    persistable variables (the scope keeps them), data variables (fed)."""
    names: set[str] = set()
    b: Block | None = block
    while b is not None:
        names.update(n for n, v in b.vars.items() if v.persistable or v.is_data)
        b = b.parent
    return names


def _op_problem(block: Block, op: Operator, available: set[str]) -> str | None:
    if not has_op_def(op.type):
        return f"unknown op type {op.type!r}: no op of that type is registered"
    opdef = get_op_def(op.type)
    errors = slot_errors(opdef, op.inputs, op.outputs)
    if errors:
        return errors[0]
    return (_variable_problem(block, op, available) or _attr_problem(op, opdef.attrs)
            or _shape_problem(block, op, opdef))


def _variable_problem(block: Block, op: Operator, available: set[str]) -> str | None:
    for kind, slots in (("input", op.inputs), ("output", op.outputs)):
        for slot, names in slots.items():
            for n in names:
                if n != EMPTY_VAR_NAME and block._find_var_recursive(n) is None:
                    return f"{kind} {slot}={n!r} is not a variable of block {block.idx}"
    for slot, names in op.inputs.items():
        for n in names:
            if n != EMPTY_VAR_NAME and n not in available:
                return (f"input {slot}={n!r} is used before any op produces it (it is not a "
                        f"parameter, a persistable or a data variable)")
    return None


def _attr_type_ok(name: str, default: Any, value: Any) -> bool:
    number = (int, float, np.integer, np.floating)
    if default is None or value is None:
        return True
    if name.endswith("dtype"):   # a numpy name, a numpy dtype or Paddle's VarType code
        return isinstance(value, (str, np.dtype, type, int, np.integer))
    if isinstance(default, bool):
        return isinstance(value, (bool, np.bool_))
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(default, int):
        return isinstance(value, (int, np.integer))
    if isinstance(default, float):
        return isinstance(value, number)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple)):   # a scalar is accepted as a one-element list
        return isinstance(value, (list, tuple, np.ndarray, *number))
    return True


def _attr_problem(op: Operator, defaults: dict[str, Any]) -> str | None:
    for name, default in defaults.items():
        value = op.attrs.get(name)
        if not _attr_type_ok(name, default, value):
            return (f"attr {name}={value!r} is a {type(value).__name__}; {op.type} expects a "
                    f"{type(default).__name__} like its default {default!r}")
    role = op.attrs.get(OP_ROLE_KEY)
    if role is None:
        return f"attr {OP_ROLE_KEY} is missing: every op carries its role (OpRole bit flags)"
    if isinstance(role, bool) or not isinstance(role, (int, np.integer)):
        return f"attr {OP_ROLE_KEY}={role!r} must be an int (OpRole bit flags)"
    role_var = op.attrs.get(OP_ROLE_VAR_KEY)
    if role_var is not None and (not isinstance(role_var, (list, tuple)) or len(role_var) % 2
                                 or not all(isinstance(v, str) for v in role_var)):
        return f"attr {OP_ROLE_VAR_KEY}={role_var!r} must be a flat list of [param, grad] pairs"
    return None


def _shapes_match(declared: tuple[int, ...], computed: tuple[int, ...]) -> bool:
    return len(declared) == len(computed) and all(
        a == b or -1 in (a, b) for a, b in zip(declared, computed))


def _shape_problem(block: Block, op: Operator, opdef: Any) -> str | None:
    if opdef.infer_shape is None:
        return None
    inputs = [block._find_var_recursive(n) for n in op.input_arg_names if n != EMPTY_VAR_NAME]
    if any(v.shape is None for v in inputs):
        return None  # nothing to check against: a variable whose shape was never known
    ctx = ShapeContext(op, block)
    try:
        opdef.infer_shape(ctx)
    except RingflowError as exc:
        return f"shape inference failed: {exc}"
    except Exception as exc:
        return f"shape inference failed: {type(exc).__name__}: {exc}"
    for slot, metas in ctx.results.items():
        for name, meta in zip(op.outputs.get(slot, []), metas):
            var = block._find_var_recursive(name) if name != EMPTY_VAR_NAME else None
            if var is None or meta is None or var.shape is None:
                continue
            shape, dtype = meta
            if not _shapes_match(var.shape, shape) or var.dtype != dtype:
                return (f"output {slot}={name!r} is declared {var.dtype}{list(var.shape)} but "
                        f"{op.type} computes {dtype}{list(shape)} from its inputs")
    return None


def _explain(block: Block, index: int, problem: str) -> str:
    op = block.ops[index]
    lo, hi = max(0, index - CONTEXT_OPS), min(len(block.ops), index + CONTEXT_OPS + 1)
    lines = [f"verify: block {block.idx}, op {index} ({op.type}): {problem}",
             "  ops around it:"]
    for j in range(lo, hi):
        mark = ">>>" if j == index else "   "
        lines.append(f"  {mark} {j:3d}: {op_to_string(block.ops[j])}")
    return "\n".join(lines)
