"""``decorate(optimizer, ...)``: an optimizer that trains with automatic mixed precision
(Paddle's ``paddle.static.amp.decorate`` / ``OptimizerWithMixedPrecision``, level O1).

backward: the AMP rewrite (``rewrite.rewrite_program``), then the inner optimizer's
backward of ``loss * loss_scaling``. apply_gradients, in the optimizer section:

    cast fp16 grad -> fp32 grad           per parameter read through a cast (moved here)
    check_finite_and_unscale              grads /= loss_scaling; FoundInfinite
    update_loss_scaling                   dynamic scaling: the scale and its step counters
    skip_update_begin                     found inf: save what the updates will write
    <the inner optimizer's clip, decay and update ops>
    skip_update_end                       found inf: put it back (the step is skipped)

State: ``loss_scaling_0`` (float32 [1], init_loss_scaling), ``num_good_steps_0`` and
``num_bad_steps_0`` (int32 [1]), persistable, filled by the startup program.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..framework.program import Block, Program, Variable, default_startup_program, program_guard
from ..framework.roles import OP_ROLE_KEY, OpRole
from ..optimizer.optimizer import _free_name
from .lists import AutoMixedPrecisionLists
from .rewrite import rewrite_program, update_role_var_grad

SAVED_SUFFIX = "@SKIP_UPDATE"


class OptimizerWithMixedPrecision:
    """Wraps ``optimizer`` (a ringflow optimizer or a meta-optimizer of fleet's chain)."""

    def __init__(self, optimizer: Any, amp_lists: AutoMixedPrecisionLists | None = None,
                 init_loss_scaling: float = 2.0 ** 15, use_dynamic_loss_scaling: bool = True,
                 incr_every_n_steps: int = 1000, decr_every_n_nan_or_inf: int = 2,
                 incr_ratio: float = 2.0, decr_ratio: float = 0.8) -> None:
        _check_scaling(init_loss_scaling, incr_every_n_steps, decr_every_n_nan_or_inf,
                       incr_ratio, decr_ratio)
        self._optimizer = optimizer
        self._amp_lists = amp_lists or AutoMixedPrecisionLists()
        self._init_loss_scaling = float(init_loss_scaling)
        self._use_dynamic_loss_scaling = bool(use_dynamic_loss_scaling)
        self._incr_every_n_steps = int(incr_every_n_steps)
        self._decr_every_n_nan_or_inf = int(decr_every_n_nan_or_inf)
        self._incr_ratio, self._decr_ratio = float(incr_ratio), float(decr_ratio)
        self._learning_rate = getattr(optimizer, "_learning_rate", None)
        self._train_program: Program | None = None
        self._startup_program: Program | None = None
        self._loss_scaling: Variable | None = None
        self._num_good_steps: Variable | None = None
        self._num_bad_steps: Variable | None = None
        self._scaled_loss: Variable | None = None
        self._found_inf: Variable | None = None

    def get_loss_scaling(self) -> Variable:
        if self._loss_scaling is None:
            raise ConfigError("get_loss_scaling: call minimize() first")
        return self._loss_scaling

    def get_scaled_loss(self) -> Variable | None:
        return self._scaled_loss

    def _scales_loss(self) -> bool:
        return self._use_dynamic_loss_scaling or self._init_loss_scaling != 1.0

    # backward --------------------------------------------------------------------------------
    def backward(self, loss: Variable, startup_program: Program | None = None,
                 parameter_list=None, no_grad_set=None, callbacks=None):
        program = loss.block.program
        self._train_program = program
        self._startup_program = startup_program or default_startup_program()
        block = program.global_block()
        self._init_amp_var(block)
        rewrite_program(block, self._amp_lists)
        if loss.dtype != "float32":
            raise ConfigError(f"amp: the loss {loss.name!r} is {loss.dtype}; mixed precision "
                              f"trains float32 models")
        self._scaled_loss = loss
        if self._scales_loss():
            self._scaled_loss = block.create_var(name=_free_name(block, f"{loss.name}_scaled"),
                                                 shape=loss.shape, dtype=loss.dtype)
            block.append_op("elementwise_mul", inputs={"X": [loss], "Y": [self._loss_scaling]},
                            outputs={"Out": [self._scaled_loss]})
        return self._optimizer.backward(self._scaled_loss, self._startup_program,
                                        parameter_list, no_grad_set, callbacks)

    def _init_amp_var(self, block: Block) -> None:
        self._loss_scaling = self._state_var(block, "loss_scaling", "float32",
                                             self._init_loss_scaling)
        if self._use_dynamic_loss_scaling:
            self._num_good_steps = self._state_var(block, "num_good_steps", "int32", 0)
            self._num_bad_steps = self._state_var(block, "num_bad_steps", "int32", 0)

    def _state_var(self, block: Block, base: str, dtype: str, value: float) -> Variable:
        """A persistable [1] variable of the main program, filled by the startup one."""
        name = _free_name(block, base)
        var = block.create_var(name=name, shape=(1,), dtype=dtype, persistable=True,
                               stop_gradient=True)
        sblock = self._startup_program.global_block()
        svar = sblock.create_var(name=name, shape=(1,), dtype=dtype, persistable=True,
                                 stop_gradient=True)
        sblock.append_op("fill_constant", outputs={"Out": [svar]},
                         attrs={"shape": [1], "dtype": dtype, "value": float(value)})
        return var

    # apply_gradients -------------------------------------------------------------------------
    def apply_gradients(self, params_grads):
        block = self._train_program.global_block()
        update_role_var_grad(block, params_grads)
        if not self._scales_loss():
            return self._optimizer.apply_gradients(params_grads)
        grads = [g for _, g in params_grads if g is not None]
        with self._train_program._optimized_guard():
            found_inf = self._check_finite_and_unscale(block, grads)
            if self._use_dynamic_loss_scaling:
                self._update_loss_scaling(block, grads, found_inf)
        first = len(block.ops)
        optimize_ops = self._optimizer.apply_gradients(params_grads)
        skip_update_when(block, block.ops[first:], found_inf)
        return optimize_ops

    def _check_finite_and_unscale(self, block: Block, grads: list[Variable]) -> Variable:
        found_inf = block.create_var(name=_free_name(block, "find_infinite_scale"), shape=(1,),
                                     dtype="bool", stop_gradient=True)
        block.append_op("check_finite_and_unscale",
                        inputs={"X": grads, "Scale": [self._loss_scaling]},
                        outputs={"Out": grads, "FoundInfinite": [found_inf]})
        self._found_inf = found_inf
        return found_inf

    def _update_loss_scaling(self, block: Block, grads: list[Variable], found_inf) -> None:
        scale, good, bad = self._loss_scaling, self._num_good_steps, self._num_bad_steps
        block.append_op(
            "update_loss_scaling",
            inputs={"X": grads, "FoundInfinite": [found_inf], "PrevLossScaling": [scale],
                    "InGoodSteps": [good], "InBadSteps": [bad]},
            outputs={"Out": grads, "LossScaling": [scale], "OutGoodSteps": [good],
                     "OutBadSteps": [bad]},
            attrs={"incr_every_n_steps": self._incr_every_n_steps,
                   "decr_every_n_nan_or_inf": self._decr_every_n_nan_or_inf,
                   "incr_ratio": self._incr_ratio, "decr_ratio": self._decr_ratio})

    def apply_optimize(self, loss, startup_program, params_grads):
        with program_guard(loss.block.program, startup_program or self._startup_program):
            return self.apply_gradients(params_grads)

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        optimize_ops = self.apply_optimize(loss, startup_program, params_grads)
        return optimize_ops, params_grads


def skip_update_when(block: Block, update_ops: list, found_inf: Variable) -> None:
    """Brackets ``update_ops`` with skip_update_begin/end over every persistable variable
    they write (parameters, moments, beta powers), so a step with non-finite gradients
    leaves all of them as they were (Paddle hands FoundInfinite to adam/adamw/lamb as
    SkipUpdate, and zeroed gradients still move momentum-based updates)."""
    state = list(dict.fromkeys(
        n for op in update_ops for n in op.output_arg_names
        if (v := block._find_var_recursive(n)) is not None and v.persistable))
    if not state:
        return
    saved = [block.create_var(name=n + SAVED_SUFFIX, shape=block.var(n).shape,
                              dtype=block.var(n).dtype, stop_gradient=True) for n in state]
    role = {OP_ROLE_KEY: int(OpRole.Optimize)}
    block.insert_op_before(update_ops[0], "skip_update_begin",
                           inputs={"X": state, "FoundInfinite": [found_inf]},
                           outputs={"Saved": saved}, attrs=role)
    block.append_op("skip_update_end", inputs={"Saved": saved, "FoundInfinite": [found_inf]},
                    outputs={"Out": state}, attrs=role)


def _check_scaling(init: Any, incr_n: Any, decr_n: Any, incr: Any, decr: Any) -> None:
    for name, value, ok in (("init_loss_scaling", init, lambda v: v > 0),
                            ("incr_ratio", incr, lambda v: v > 1.0),
                            ("decr_ratio", decr, lambda v: 0.0 < v < 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ConfigError(f"amp: {name} out of range: {value!r} (init_loss_scaling > 0, "
                              f"incr_ratio > 1, 0 < decr_ratio < 1)")
    for name, value in (("incr_every_n_steps", incr_n), ("decr_every_n_nan_or_inf", decr_n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"amp: {name} must be an integer >= 1, got {value!r}")


def decorate(optimizer: Any, amp_lists: AutoMixedPrecisionLists | None = None,
             init_loss_scaling: float = 2.0 ** 15, incr_every_n_steps: int = 1000,
             decr_every_n_nan_or_inf: int = 2, incr_ratio: float = 2.0,
             decr_ratio: float = 0.8, use_dynamic_loss_scaling: bool = True,
             use_pure_fp16: bool = False, use_fp16_guard: bool | None = None,
             ) -> OptimizerWithMixedPrecision:
    """Paddle's ``paddle.static.amp.decorate`` (level O1 only: ``use_pure_fp16`` is a
    ConfigError; ``use_fp16_guard`` has no meaning at O1, as in Paddle)."""
    if use_pure_fp16:
        raise ConfigError("amp: use_pure_fp16 (level O2, float16 parameters) is not "
                          "supported; ringflow trains O1: float32 master weights")
    return OptimizerWithMixedPrecision(optimizer, amp_lists, init_loss_scaling,
                                       use_dynamic_loss_scaling, incr_every_n_steps,
                                       decr_every_n_nan_or_inf, incr_ratio, decr_ratio)


__all__ = ["OptimizerWithMixedPrecision", "decorate"]
