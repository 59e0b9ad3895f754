"""Momentum (op ``momentum``, optionally Nesterov) and LARS momentum (op ``lars_momentum``,
layer-wise adaptive rate scaling for large batches)."""

from __future__ import annotations

from .optimizer import L2Decay, Optimizer, check_float


class Momentum(Optimizer):
    """``paddle.optimizer.Momentum``: v = mu v + g; p -= lr v (Nesterov: lr (g + mu v)).

    An L2 ``weight_decay`` is folded into the update op (``regularization_method``
    "l2_decay"), as Paddle does, instead of separate decay ops."""

    type = "momentum"

    def __init__(self, learning_rate=0.001, momentum: float = 0.9, parameters=None,
                 use_nesterov: bool = False, weight_decay=None, grad_clip=None,
                 multi_precision: bool = False, rescale_grad: float = 1.0, name=None) -> None:
        super().__init__(learning_rate, parameters, weight_decay, grad_clip, name)
        self._momentum = check_float("Momentum", "momentum", momentum, 0.0)
        self._use_nesterov = bool(use_nesterov)
        self._decay = self.regularization if isinstance(self.regularization, L2Decay) else None
        if self._decay is not None:
            self.regularization = None     # applied inside the momentum op

    def _create_accumulators(self, block, parameters) -> None:
        for p in parameters:
            self._add_accumulator("velocity", p)

    def _append_optimize_op(self, block, param_and_grad):
        param, grad = param_and_grad
        velocity = self._get_accumulator("velocity", param)
        decay = self._decay.coeff if self._decay is not None else 0.0
        return block.append_op(
            self.type,
            inputs={"Param": param, "Grad": grad, "Velocity": velocity,
                    "LearningRate": self._create_param_lr(param_and_grad)},
            outputs={"ParamOut": param, "VelocityOut": velocity},
            attrs={"mu": self._momentum, "use_nesterov": self._use_nesterov,
                   "regularization_method": "l2_decay" if decay else "",
                   "regularization_coeff": decay})


class LarsMomentum(Optimizer):
    """``paddle.fluid.optimizer.LarsMomentumOptimizer``:
    local_lr = lr * lars_coeff * |p| / (|g| + lars_weight_decay * |p| + epsilon);
    v = mu v + local_lr (g + lars_weight_decay p); p -= v.

    Parameters whose name contains one of ``exclude_from_weight_decay`` get no LARS decay
    (and so plain momentum with rate lr)."""

    type = "lars_momentum"

    def __init__(self, learning_rate, momentum: float, lars_coeff: float = 0.001,
                 lars_weight_decay: float = 0.0005, parameters=None, weight_decay=None,
                 grad_clip=None, name=None, exclude_from_weight_decay=None,
                 epsilon: float = 0.0, multi_precision: bool = False,
                 rescale_grad: float = 1.0, parameter_list=None, regularization=None) -> None:
        super().__init__(learning_rate, parameters if parameters is not None else parameter_list,
                         weight_decay if weight_decay is not None else regularization,
                         grad_clip, name)
        self._momentum = check_float("LarsMomentum", "momentum", momentum, 0.0)
        self._lars_coeff = check_float("LarsMomentum", "lars_coeff", lars_coeff, 0.0)
        self._lars_weight_decay = check_float("LarsMomentum", "lars_weight_decay",
                                              lars_weight_decay, 0.0)
        self._epsilon = check_float("LarsMomentum", "epsilon", epsilon, 0.0)
        self._exclude = list(exclude_from_weight_decay or [])

    def _create_accumulators(self, block, parameters) -> None:
        for p in parameters:
            self._add_accumulator("velocity", p)

    def _append_optimize_op(self, block, param_and_grad):
        param, grad = param_and_grad
        velocity = self._get_accumulator("velocity", param)
        wd = self._lars_weight_decay
        if any(part in param.name for part in self._exclude):
            wd = 0.0
        return block.append_op(
            self.type,
            inputs={"Param": param, "Grad": grad, "Velocity": velocity,
                    "LearningRate": self._create_param_lr(param_and_grad)},
            outputs={"ParamOut": param, "VelocityOut": velocity},
            attrs={"mu": self._momentum, "lars_coeff": self._lars_coeff,
                   "lars_weight_decay": wd, "epsilon": self._epsilon})


Lars = LarsMomentum
LarsMomentumOptimizer = LarsMomentum
