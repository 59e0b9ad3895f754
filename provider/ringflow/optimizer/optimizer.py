"""The optimizer base class: gradients in, update ops out (Paddle 2.x static-graph API).

``minimize`` = ``backward`` (``ringflow.append_backward``) + ``apply_gradients``, which
sorts the (param, grad) pairs by parameter name, clips (``grad_clip``), adds L2 weight
decay ops, then appends one update op per parameter under ``_optimized_guard([p, g])``
(role Optimize, ``op_role_var`` [p, g]). Learning rate and accumulators (moments, beta
powers, velocity) are persistable variables of the main program, initialised by
``fill_constant`` ops appended to the startup program.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, ProgramError
from ..framework.program import (
    Block,
    Parameter,
    Program,
    Variable,
    default_startup_program,
    program_guard,
)
from .lr import LRScheduler


class L2Decay:
    """L2 weight decay: ``grad += coeff * param`` (``paddle.regularizer.L2Decay``)."""

    def __init__(self, coeff: float = 0.0) -> None:
        self.coeff = float(coeff)

    def __repr__(self) -> str:
        return f"L2Decay(coeff={self.coeff})"


class Optimizer:
    """Base of SGD, Momentum, Adam, AdamW, Lamb and LarsMomentum.

    ``learning_rate``: a float, or an ``lr.LRScheduler`` the executor steps after each run.
    ``parameters``: the parameters to update (default: every trainable one).
    ``weight_decay``: a float or ``L2Decay`` (gradient += coeff * param; AdamW and Lamb
    read it as their decoupled decay coefficient instead). ``grad_clip``: e.g.
    ``ClipGradByGlobalNorm``.
    """

    #: the update op type this optimizer appends
    type = ""

    def __init__(self, learning_rate: float | LRScheduler = 0.001, parameters=None,
                 weight_decay: float | L2Decay | None = None, grad_clip=None,
                 name: str | None = None) -> None:
        if isinstance(learning_rate, bool) or not isinstance(
                learning_rate, (int, float, LRScheduler)):
            raise ConfigError(f"{type(self).__name__}: learning_rate must be a float or an "
                              f"LRScheduler, got {type(learning_rate).__name__}")
        if grad_clip is not None and not callable(grad_clip):
            raise ConfigError(f"{type(self).__name__}: grad_clip must be a clip object such "
                              f"as ClipGradByGlobalNorm, got {type(grad_clip).__name__}")
        self._learning_rate = learning_rate
        self._parameter_list = list(parameters) if parameters is not None else None
        if isinstance(weight_decay, (int, float)) and not isinstance(weight_decay, bool):
            weight_decay = L2Decay(weight_decay)
        self.regularization = weight_decay
        self._grad_clip = grad_clip
        self._name = name
        self._startup_program: Program | None = None
        # accumulator kind -> parameter name -> main-program variable
        self._accumulators: dict[str, dict[str, Variable]] = {}
        self._lr_vars: dict[int, Variable] = {}  # id(main program) -> learning-rate var

    # the public API ---------------------------------------------------------------------------
    def minimize(self, loss: Variable, startup_program: Program | None = None,
                 parameter_list=None, no_grad_set=None):
        """Appends backward and update ops; returns (optimize_ops, params_grads)."""
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        optimize_ops = self.apply_optimize(loss, startup_program, params_grads)
        return optimize_ops, params_grads

    def backward(self, loss: Variable, startup_program: Program | None = None,
                 parameter_list=None, no_grad_set=None, callbacks=None):
        """Appends the backward pass of ``loss``; returns [(Parameter, grad Variable)]."""
        from ..backward import append_backward

        if startup_program is not None:
            self._startup_program = startup_program
        params = parameter_list if parameter_list is not None else self._parameter_list
        return append_backward(loss, parameter_list=params, no_grad_set=no_grad_set)

    def apply_optimize(self, loss: Variable, startup_program: Program | None, params_grads):
        startup = startup_program or self._startup_program or default_startup_program()
        with program_guard(loss.block.program, startup):
            return self.apply_gradients(params_grads)

    def apply_gradients(self, params_grads) -> list:
        """Clip, decay, then one update op per parameter, sorted by parameter name."""
        params_grads = sorted(((p, g) for p, g in params_grads if g is not None),
                              key=lambda pg: pg[0].name)
        if not params_grads:
            return []
        if self._grad_clip is not None:
            params_grads = self._grad_clip(params_grads)
        params_grads = self._append_regularization(params_grads)
        return self._create_optimization_pass(params_grads)

    def get_lr(self) -> float:
        lr = self._learning_rate
        return lr() if isinstance(lr, LRScheduler) else float(lr)

    def set_lr(self, value: float) -> None:
        """Sets a float learning rate, also in the global scope's learning-rate variables."""
        from ..executor import global_scope

        if isinstance(self._learning_rate, LRScheduler):
            raise ConfigError("set_lr: this optimizer's learning rate is an LRScheduler; "
                              "change the scheduler instead")
        self._learning_rate = float(value)
        for var in self._lr_vars.values():
            global_scope()[var.name] = np.array([value], dtype=var.dtype)

    # building blocks for subclasses --------------------------------------------------------------
    def _startup(self) -> Program:
        return self._startup_program or default_startup_program()

    def _create_optimization_pass(self, params_grads) -> list:
        main = params_grads[0][0].block.program
        block = main.global_block()
        self._create_global_learning_rate(main, params_grads[0][0].dtype)
        trainable = [(p, g) for p, g in params_grads if getattr(p, "trainable", True)]
        self._create_accumulators(block, [p for p, _ in trainable])
        ops = []
        for p, g in trainable:
            with main._optimized_guard([p, g]):
                ops.append(self._append_optimize_op(block, (p, g)))
        return ops

    def _create_accumulators(self, block: Block, parameters: list[Parameter]) -> None:
        """Subclasses add their accumulators (``_add_accumulator``) here."""

    def _append_optimize_op(self, block: Block, param_and_grad):
        raise NotImplementedError(f"{type(self).__name__} must append its update op")

    def _create_global_learning_rate(self, main: Program, dtype: str) -> Variable:
        if id(main) in self._lr_vars:
            return self._lr_vars[id(main)]
        lr = self._learning_rate
        value = lr() if isinstance(lr, LRScheduler) else float(lr)
        name = _free_name(main.global_block(), "learning_rate")
        var = self._persistable_var(main, name, (1,), dtype, value)
        if isinstance(lr, LRScheduler):
            if main.lr_scheduler is not None and main.lr_scheduler is not lr:
                raise ProgramError(f"program already has a learning-rate scheduler feeding "
                                   f"{main.lr_scheduler.var_name!r}; one per program")
            lr.var_name = name
            main.lr_scheduler = lr
        self._lr_vars[id(main)] = var
        return var

    def _global_learning_rate(self, program: Program) -> Variable:
        return self._lr_vars[id(program)]

    def _create_param_lr(self, param_and_grad) -> Variable:
        """The global learning rate, times the parameter's multiplier when it is not 1."""
        param = param_and_grad[0]
        lr_var = self._global_learning_rate(param.block.program)
        factor = float(getattr(param, "optimize_attr", {}).get("learning_rate", 1.0))
        if factor == 1.0:
            return lr_var
        block = param.block.program.global_block()
        out = block.create_var(name=_free_name(block, f"{param.name}_learning_rate"),
                               shape=(1,), dtype=lr_var.dtype, stop_gradient=True)
        block.append_op("scale", inputs={"X": lr_var}, outputs={"Out": out},
                        attrs={"scale": factor})
        return out

    def _add_accumulator(self, name: str, param: Parameter, dtype: str | None = None,
                         fill_value: float = 0.0, shape=None) -> Variable:
        per_param = self._accumulators.setdefault(name, {})
        if param.name in per_param:
            return per_param[param.name]
        main = param.block.program
        var_name = _free_name(main.global_block(), f"{param.name}_{name}")
        var = self._persistable_var(main, var_name, tuple(shape or param.shape),
                                    dtype or param.dtype, fill_value)
        per_param[param.name] = var
        return var

    def _get_accumulator(self, name: str, param: Parameter) -> Variable:
        try:
            return self._accumulators[name][param.name]
        except KeyError:
            raise ProgramError(f"{type(self).__name__}: no accumulator {name!r} for "
                               f"parameter {param.name!r}") from None

    def _persistable_var(self, main: Program, name: str, shape, dtype: str,
                         value: float) -> Variable:
        """A persistable var in main, and its twin plus fill_constant in the startup."""
        var = main.global_block().create_var(name=name, shape=shape, dtype=dtype,
                                             persistable=True, stop_gradient=True)
        sblock = self._startup().global_block()
        svar = sblock.create_var(name=name, shape=shape, dtype=dtype, persistable=True,
                                 stop_gradient=True)
        sblock.append_op("fill_constant", outputs={"Out": svar},
                         attrs={"shape": list(shape), "dtype": dtype, "value": float(value)})
        return var

    def _append_regularization(self, params_grads):
        """L2 decay as ops: grad' = sum(grad, scale(param, coeff)), role Optimize."""
        reg = self.regularization
        if reg is None or not getattr(reg, "coeff", 0.0):
            return params_grads
        out = []
        for p, g in params_grads:
            block = p.block.program.global_block()
            with p.block.program._optimized_guard([p, g]):
                decay = block.create_var(name=_free_name(block, f"{p.name}_l2_decay"),
                                         shape=p.shape, dtype=p.dtype, stop_gradient=True)
                block.append_op("scale", inputs={"X": p}, outputs={"Out": decay},
                                attrs={"scale": reg.coeff})
                new_g = block.create_var(name=_free_name(block, f"{g.name}_regularized"),
                                         shape=g.shape, dtype=g.dtype, stop_gradient=True)
                block.append_op("sum", inputs={"X": [g, decay]}, outputs={"Out": new_g})
            out.append((p, new_g))
        return out


def _free_name(block: Block, base: str) -> str:
    """``base_0``, ``base_1``, ...: the first not yet a variable of ``block`` (Paddle's
    unique names, made per program so two builds name their variables alike)."""
    k = 0
    while f"{base}_{k}" in block.vars:
        k += 1
    return f"{base}_{k}"


def check_float(owner: str, name: str, value: Any, lo: float | None = None,
                hi: float | None = None) -> float:
    """A hyper-parameter as a float, in [lo, hi) when bounds are given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{owner}: {name} must be a float, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value >= hi):
        raise ConfigError(f"{owner}: {name} must be in [{lo}, {hi}), got {value!r}")
    return float(value)
