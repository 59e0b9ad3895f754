"""Gradient merge (Paddle's ``gradient_merge`` strategy, GradientMergeOptimizer): every run
of the main program is one micro-step; the optimizer applies the gradients merged over
``k_steps`` micro-steps (their mean with ``avg``, else their sum) once every k-th run, so k
micro-steps of batch b train as one step of batch k*b.

Applied by fleet to the programs the whole meta-optimizer chain built (so it composes with
tensor and data parallelism, whose gradient all-reduces run each micro-step: the sum of
all-reduced gradients is the all-reduce of their sum). The rewrite of the main program:

    <forward, backward: the gradients g of this micro-step (all-reduced if data-parallel)>
    gradient_merge_step      step += 1; skip = step % k != 0
    elementwise_add          g@GradientMerge += g          (persistable, zeros at startup)
    scale                    g@GradientMerge@MERGED = g@GradientMerge * (1/k if avg else 1)
    skip_update_begin        skip: save what the optimizer section writes
    <the optimizer section, reading g@GradientMerge@MERGED where it read g>
    skip_update_end          skip: put it back (parameters and moments untouched)
    gradient_merge_clear     not skip: g@GradientMerge = 0

The program's ``runs_per_step`` becomes k: the executor steps an LR scheduler once per k
runs, so every micro-step of a step uses that step's rate.

Paddle runs the optimizer section inside a conditional block; ringflow's programs have no
control flow, so the section runs every micro-step and its writes are undone on the k-1
that do not apply (a copy of the optimizer state per skipped micro-step).
"""

from __future__ import annotations

from ...amp.decorator import skip_update_when
from ...errors import ConfigError
from ...framework.program import Block
from ...framework.roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole, is_backward_op, is_optimizer_op

MERGE_SUFFIX = "@GradientMerge"
STEP_NAME = "gradient_merge_step"


def check_strategy(strategy) -> int:
    """k_steps when gradient merge applies (``gradient_merge`` on, k_steps > 1), else 0;
    a ConfigError for what it does not combine with."""
    configs = strategy.gradient_merge_configs
    if not strategy.gradient_merge or configs["k_steps"] <= 1:
        return 0
    for other in ("sharding", "amp"):
        if getattr(strategy, other):
            raise ConfigError(f"gradient_merge with {other} is not supported by ringflow "
                              "(it combines with tensor and data parallelism)")
    return int(configs["k_steps"])


def apply(main_block: Block, startup_block: Block, k_steps: int, avg: bool) -> list[str]:
    """Rewrites the programs for gradient merge over ``k_steps`` micro-steps; returns the
    merged gradients' names."""
    section = main_block.find_ops(is_optimizer_op)
    if not section:
        raise ConfigError("gradient_merge: the main program has no optimizer ops")
    first = section[0]
    grads = param_grads(main_block)
    role = {OP_ROLE_KEY: int(OpRole.Optimize)}
    step = _persistable(main_block, startup_block, STEP_NAME, (1,), "int64")
    skip = main_block.create_var(name=main_block.program.unique_name("gradient_merge_skip"),
                                 shape=(1,), dtype="bool", stop_gradient=True)
    main_block.insert_op_before(first, "gradient_merge_step", inputs={"Step": [step]},
                                outputs={"StepOut": [step], "Skip": [skip]},
                                attrs={"k_steps": k_steps, **role})
    accumulators = []
    for grad in grads:
        var = main_block.var(grad)
        acc = _persistable(main_block, startup_block, grad + MERGE_SUFFIX, var.shape, var.dtype)
        merged = main_block.create_var(name=acc.name + "@MERGED", shape=var.shape,
                                       dtype=var.dtype, stop_gradient=True)
        main_block.insert_op_before(first, "elementwise_add", inputs={"X": [acc], "Y": [grad]},
                                    outputs={"Out": [acc]}, attrs={"axis": -1, **role})
        main_block.insert_op_before(
            first, "scale", inputs={"X": [acc]}, outputs={"Out": [merged]},
            attrs={"scale": 1.0 / k_steps if avg else 1.0, "bias": 0.0,
                   "bias_after_scale": True, **role})
        for op in section:
            if grad in op.input_arg_names or grad in op.output_arg_names:
                main_block.rename_var_in_op(op, grad, merged.name)
                _rename_role_var(op, grad, merged.name)
        accumulators.append(acc)
    skip_update_when(main_block, section, skip)
    main_block.program.runs_per_step = k_steps   # the learning rate moves once per step
    main_block.append_op("gradient_merge_clear", inputs={"X": accumulators, "Skip": [skip]},
                         outputs={"Out": accumulators}, attrs=role)
    return grads


def param_grads(block: Block) -> list[str]:
    """The parameter gradients the backward pass writes (from ``op_role_var``), in order."""
    grads: list[str] = []
    for op in block.ops:
        if is_backward_op(op) and not is_optimizer_op(op):
            role_var = op.attr(OP_ROLE_VAR_KEY) or []
            grads += [g for g in role_var[1::2] if g not in grads]
    if not grads:
        raise ConfigError("gradient_merge: the main program has no parameter gradients")
    return grads


def _rename_role_var(op, old: str, new: str) -> None:
    role_var = op.attr(OP_ROLE_VAR_KEY)
    if role_var and old in role_var:
        op._set_attr(OP_ROLE_VAR_KEY, [new if n == old else n for n in role_var])


def _persistable(block: Block, sblock: Block, name: str, shape, dtype):
    """A persistable variable of the main program, filled with zeros by the startup one."""
    if any(d is None or d < 0 for d in shape):
        raise ConfigError(f"gradient_merge: {name} has no fixed shape ({list(shape)})")
    var = block.create_var(name=name, shape=tuple(shape), dtype=dtype, persistable=True,
                           stop_gradient=True)
    svar = sblock.create_var(name=name, shape=tuple(shape), dtype=dtype, persistable=True,
                             stop_gradient=True)
    sblock.append_op("fill_constant", outputs={"Out": [svar]},
                     attrs={"shape": list(shape), "dtype": dtype, "value": 0.0})
    return var
