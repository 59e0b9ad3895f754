"""Readable listings of programs and ops: ``str(program)`` reads like Paddle's."""

from __future__ import annotations

from typing import Any

import numpy as np

from .roles import OP_ROLE_KEY


def _fmt_attr(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"array{list(value.shape)}"
    return repr(value)


def _fmt_slots(slots: dict[str, list[str]]) -> str:
    return ", ".join(f"{slot}=[{', '.join(names)}]" for slot, names in slots.items())


def op_to_string(op) -> str:
    attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(op.attrs.items())
                      if k != OP_ROLE_KEY)
    role = op.attrs.get(OP_ROLE_KEY, 0)
    return (f"{{{_fmt_slots(op.outputs)}}} = {op.type}(inputs={{{_fmt_slots(op.inputs)}}}, "
            f"op_role={role}{', ' + attrs if attrs else ''})")


def block_to_string(block) -> str:
    lines = [f"block {block.idx} (parent {block.parent_idx}) {{"]
    lines += [f"    {v!r}" for v in block.vars.values()]
    lines += [f"    {i:3d}: {op_to_string(op)}" for i, op in enumerate(block.ops)]
    lines.append("}")
    return "\n".join(lines)


def program_to_string(program) -> str:
    return "\n".join(block_to_string(b) for b in program.blocks)
