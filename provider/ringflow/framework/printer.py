"""Readable listings of programs and ops. ``str(program)`` keeps Paddle's
``{Out=[y]} = type(X=[x])`` shape, names each op's role (``# Backward|Loss``) and lists
variables in aligned columns with their kind (data, param, persist, var), dtype and shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole

# Bits in the order they are named; a role with none of the first five is a forward op.
_ROLE_BITS = (OpRole.Backward, OpRole.Optimize, OpRole.RPC, OpRole.Dist, OpRole.LRSched,
              OpRole.Loss)
_NAME_WIDTH_CAP = 40  # longer variable names are not padded further


def role_name(role: Any) -> str:
    """``257`` -> ``"Backward|Loss"``, ``256`` -> ``"Forward|Loss"``, ``0`` -> ``"Forward"``;
    bits OpRole does not know are shown in hex."""
    role = int(role)
    names = [bit.name for bit in _ROLE_BITS if role & bit]
    if not role & sum(int(b) for b in _ROLE_BITS[:-1]):
        names.insert(0, "Forward")
    unknown = role & ~sum(int(b) for b in _ROLE_BITS)
    if unknown:
        names.append(hex(unknown))
    return "|".join(names)


def _fmt_attr(name: str, value: Any) -> str:
    if name == OP_ROLE_VAR_KEY and isinstance(value, (list, tuple)):
        return f"[{', '.join(map(str, value))}]"
    if isinstance(value, np.ndarray):
        return f"array{list(value.shape)}"
    return repr(value)


def _fmt_slots(slots: dict[str, list[str]]) -> str:
    return ", ".join(f"{slot}=[{', '.join(names)}]" for slot, names in slots.items())


def op_body(op) -> str:
    """``{Out=[y]} = scale(X=[x]; bias=0.0, scale=2.0)``: outputs, type, inputs, then the
    attrs sorted by name, without ``op_role``."""
    attrs = ", ".join(f"{k}={_fmt_attr(k, v)}" for k, v in sorted(op.attrs.items())
                      if k != OP_ROLE_KEY)
    args = "; ".join(part for part in (_fmt_slots(op.inputs), attrs) if part)
    return f"{{{_fmt_slots(op.outputs)}}} = {op.type}({args})"


def op_role_name(op) -> str:
    role = op.attrs.get(OP_ROLE_KEY)
    if role is None:
        return "no op_role"
    # a malformed role is still printed: verify's message shows the op that carries it
    return role_name(role) if isinstance(role, (int, np.integer)) else f"op_role={role!r}"


def op_to_string(op) -> str:
    """One op on one line, its role as a trailing comment: ``... = scale(X=[x]; ...)  #
    Forward``."""
    return f"{op_body(op)}  # {op_role_name(op)}"


def var_kind(var) -> str:
    """What a variable is, as a listing shows it: param, data, persist or var."""
    if var.is_parameter:
        return "param"
    if var.is_data:
        return "data"
    return "persist" if var.persistable else "var"


def var_to_string(var, name_width: int = 0) -> str:
    """``param fc_0.w_0 : float32[64, 256]`` (+ flags: stop_gradient, frozen, distributed)."""
    flags = []
    if var.is_parameter:
        flags += [f for f, on in (("frozen", not var.trainable),
                                  ("distributed", var.is_distributed)) if on]
    elif var.stop_gradient and not (var.is_data or var.persistable):
        flags.append("stop_gradient")
    shape = "?" if var.shape is None else list(var.shape)
    kind = f"{var_kind(var):<7}" if name_width else var_kind(var)  # columns in listings
    text = f"{kind} {var.name:<{name_width}} : {var.dtype}{shape}"
    return text + "".join(f", {f}" for f in flags)


def block_to_string(block) -> str:
    parent = f" (parent {block.parent_idx})" if block.parent_idx >= 0 else ""
    width = min(_NAME_WIDTH_CAP, max((len(n) for n in block.vars), default=0))
    lines = [f"block {block.idx}{parent} {{ // {len(block.vars)} vars, {len(block.ops)} ops"]
    lines += [f"    {var_to_string(v, width)}" for v in block.vars.values()]
    if block.vars and block.ops:
        lines.append("")
    # ops as "index  role  body": the role column makes forward, backward and optimize
    # phases visible at a glance
    index_width = len(str(max(len(block.ops) - 1, 0)))
    roles = [op_role_name(op) for op in block.ops]
    role_width = max(map(len, roles), default=0)
    lines += [f"    {i:>{index_width}}  {role:<{role_width}}  {op_body(op)}"
              for i, (op, role) in enumerate(zip(block.ops, roles))]
    lines.append("}")
    return "\n".join(lines)


def program_to_string(program) -> str:
    head = f"program (random_seed={program.random_seed}, {len(program.blocks)} block" \
           f"{'s' if len(program.blocks) != 1 else ''})"
    return "\n".join([head, *(block_to_string(b) for b in program.blocks)])
