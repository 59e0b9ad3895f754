"""The static program IR: programs, blocks, variables, ops, roles, the op table."""

from .program import (
    Block,
    Operator,
    Parameter,
    Program,
    Variable,
    default_main_program,
    default_startup_program,
    program_guard,
)
from .registry import grad_var_name, register_op
from .roles import (
    OP_ROLE_KEY,
    OP_ROLE_VAR_KEY,
    OpRole,
    is_backward_op,
    is_loss_grad_op,
    is_optimizer_op,
    is_update_op,
)

__all__ = [
    "OP_ROLE_KEY",
    "OP_ROLE_VAR_KEY",
    "Block",
    "OpRole",
    "Operator",
    "Parameter",
    "Program",
    "Variable",
    "default_main_program",
    "default_startup_program",
    "grad_var_name",
    "is_backward_op",
    "is_loss_grad_op",
    "is_optimizer_op",
    "is_update_op",
    "program_guard",
    "register_op",
]
