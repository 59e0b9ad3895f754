"""Op roles as PaddlePaddle defines them: bit flags OR-ed into the ``op_role`` attribute."""

from __future__ import annotations

import enum

OP_ROLE_KEY = "op_role"
OP_ROLE_VAR_KEY = "op_role_var"


class OpRole(enum.IntFlag):
    Forward = 0x0000
    Backward = 0x0001
    Optimize = 0x0002
    RPC = 0x0004
    Dist = 0x0008
    LRSched = 0x0010
    Loss = 0x0100


def _role(op) -> int | None:
    return int(op.attr(OP_ROLE_KEY)) if op.has_attr(OP_ROLE_KEY) else None


def is_backward_op(op) -> bool:
    role = _role(op)
    return role is not None and bool(role & OpRole.Backward)


def is_loss_grad_op(op) -> bool:
    # Paddle returns the int 256 here; a bool reads better and has the same truthiness.
    role = _role(op)
    return role is not None and bool(role & OpRole.Backward) and bool(role & OpRole.Loss)


def is_optimizer_op(op) -> bool:
    role = _role(op)
    return role is not None and bool(role & OpRole.Optimize)


def is_update_op(op) -> bool:
    """True for ops that update a parameter: they have Param, Grad and LearningRate inputs."""
    return all(slot in op.input_names for slot in ("Param", "Grad", "LearningRate"))
