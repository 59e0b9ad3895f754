"""Reverse-mode autodiff over a block: ``append_backward`` and ``gradients``, with
PaddlePaddle's op sequence and roles (reference/paddle-semantics.md 1.2). The steps are
``autodiff``'s; the backward pass with checkpoints is ``recompute``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .autodiff import (
    as_list,
    backward_ops,
    check_loss,
    mark_op_role_vars,
    no_grad_names,
    producer_index,
    requiring_grad,
    trainable_parameters,
    var_names,
)
from .errors import ProgramError
from .framework.program import Block, Parameter, Variable
from .framework.registry import grad_var_name
from .framework.roles import OP_ROLE_KEY, OpRole
from .recompute import append_backward_with_checkpoints

__all__ = ["append_backward", "gradients"]


def append_backward(loss: Variable, parameter_list: Iterable[Any] | None = None,
                    no_grad_set: Iterable[Any] | None = None,
                    callbacks: Sequence[Callable] | None = None,
                    checkpoints: Iterable[Any] | None = None,
                    ) -> list[tuple[Parameter, Variable]]:
    """Appends the backward pass of ``loss`` to its block; returns [(parameter, gradient)]
    for the trainable parameters (or ``parameter_list``) that get a gradient.

    As Paddle: the op producing the loss gets role Loss; ``fill_constant`` with role
    Backward|Loss writes ``loss@GRAD`` = 1; grad ops get role Backward; the last op
    writing each parameter's gradient gets ``op_role_var`` = [param, grad] + existing.
    ``callbacks`` are called as ``cb(block=..., context=...)`` after each grad op.
    ``checkpoints`` (variables or names): the forward ops between them are recomputed in
    the backward pass (``ringflow.recompute``); Paddle then also returns the checkpoint
    names, ringflow the same list as without.
    """
    if checkpoints:
        return append_backward_with_checkpoints(loss, checkpoints, parameter_list,
                                                no_grad_set, callbacks)
    loss = check_loss(loss)
    block, program = loss.block, loss.block.program
    loss_idx = producer_index(block, loss.name)
    loss_op = block.ops[loss_idx]
    loss_op._set_attr(OP_ROLE_KEY, int(loss_op.attr(OP_ROLE_KEY) or 0) | int(OpRole.Loss))
    ops = block.ops[: loss_idx + 1]
    req = requiring_grad(block, ops, no_grad_names(block, no_grad_set), None)
    loss_grad = grad_var_name(loss.name)
    with program._backward_role_guard():
        block.create_var(name=loss_grad, shape=loss.shape, dtype=loss.dtype)
        block.append_op("fill_constant", outputs={"Out": [loss_grad]},
                        attrs={"shape": list(loss.shape), "value": 1.0, "dtype": loss.dtype,
                               OP_ROLE_KEY: int(OpRole.Backward | OpRole.Loss)})
        written = backward_ops(block, ops, [loss.name], req, [loss_grad], callbacks)
    params_grads = [(p, block.var(grad_var_name(p.name)))
                    for p in trainable_parameters(block, parameter_list)
                    if grad_var_name(p.name) in written]
    mark_op_role_vars(block, params_grads)
    return params_grads


def gradients(targets: Any, inputs: Any, target_gradients: Any = None,
              no_grad_set: Iterable[Any] | None = None) -> list[Variable | None]:
    """Appends ops computing d(sum of targets)/d(inputs); returns one gradient variable per
    input (None where no gradient flows). ``target_gradients`` (one per target, None for
    ones) weight the targets, as Paddle's ``gradients``. Inputs need not be trainable."""
    targets, inputs = as_list(targets), as_list(inputs)
    tgrads = as_list(target_gradients) if target_gradients is not None else [None] * len(targets)
    if len(tgrads) != len(targets):
        raise ProgramError(f"gradients: {len(targets)} targets but {len(tgrads)} "
                           f"target_gradients")
    block, program = targets[0].block, targets[0].block.program
    last = max(producer_index(block, t.name) for t in targets)
    ops = block.ops[: last + 1]
    keep = var_names(inputs)
    req = requiring_grad(block, ops, no_grad_names(block, no_grad_set, keep), keep)
    with program._backward_role_guard():
        seeded = [_seed_target_grad(block, t, tg) for t, tg in zip(targets, tgrads)]
        written = backward_ops(block, ops, [t.name for t in targets], req, seeded, None)
    return [block.var(grad_var_name(x.name)) if grad_var_name(x.name) in written else None
            for x in inputs]


def _seed_target_grad(block: Block, target: Variable, given: Variable | None) -> str:
    g = grad_var_name(target.name)
    block.create_var(name=g, shape=target.shape, dtype=target.dtype)
    if given is not None:
        block.append_op("assign", inputs={"X": [given.name]}, outputs={"Out": [g]})
    elif target.shape is not None and all(d >= 0 for d in target.shape):
        block.append_op("fill_constant", outputs={"Out": [g]},
                        attrs={"shape": list(target.shape), "value": 1.0,
                               "dtype": target.dtype})
    else:
        # Batch-sized target: ones shaped like it at run time.
        block.append_op("fill_zeros_like", inputs={"X": [target.name]}, outputs={"Out": [g]})
        block.append_op("scale", inputs={"X": [g]}, outputs={"Out": [g]},
                        attrs={"scale": 1.0, "bias": 1.0})
    return g
