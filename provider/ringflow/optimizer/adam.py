"""The Adam family: Adam (op ``adam``), AdamW (``adamw``: decoupled weight decay) and Lamb
(``lamb``: Adam direction scaled per layer by |param| / |direction|).

Accumulators per parameter, as Paddle names them: ``<param>_moment1_0``,
``<param>_moment2_0`` (param shape, zeros), ``<param>_beta1_pow_acc_0`` and
``<param>_beta2_pow_acc_0`` (shape [1], starting at beta1 and beta2: the bias corrections
of step t read beta^t, then the op multiplies them by beta).
"""

from __future__ import annotations

from collections.abc import Callable

from .optimizer import Optimizer, check_float


class Adam(Optimizer):
    """``paddle.optimizer.Adam``."""

    type = "adam"

    def __init__(self, learning_rate=0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, parameters=None, weight_decay=None, grad_clip=None,
                 lazy_mode: bool = False, multi_precision: bool = False,
                 use_multi_tensor: bool = False, name=None) -> None:
        super().__init__(learning_rate, parameters, weight_decay, grad_clip, name)
        owner = type(self).__name__
        self._beta1 = check_float(owner, "beta1", beta1, 0.0, 1.0)
        self._beta2 = check_float(owner, "beta2", beta2, 0.0, 1.0)
        self._epsilon = check_float(owner, "epsilon", epsilon, 0.0)

    def _create_accumulators(self, block, parameters) -> None:
        for p in parameters:
            self._add_accumulator("moment1", p)
            self._add_accumulator("moment2", p)
            self._add_accumulator("beta1_pow_acc", p, fill_value=self._beta1, shape=(1,))
            self._add_accumulator("beta2_pow_acc", p, fill_value=self._beta2, shape=(1,))

    def _op_attrs(self, param) -> dict:
        return {"beta1": self._beta1, "beta2": self._beta2, "epsilon": self._epsilon}

    def _append_optimize_op(self, block, param_and_grad):
        param, grad = param_and_grad
        acc = {k: self._get_accumulator(k, param)
               for k in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc")}
        return block.append_op(
            self.type,
            inputs={"Param": param, "Grad": grad,
                    "LearningRate": self._create_param_lr(param_and_grad),
                    "Moment1": acc["moment1"], "Moment2": acc["moment2"],
                    "Beta1Pow": acc["beta1_pow_acc"], "Beta2Pow": acc["beta2_pow_acc"]},
            outputs={"ParamOut": param, "Moment1Out": acc["moment1"],
                     "Moment2Out": acc["moment2"], "Beta1PowOut": acc["beta1_pow_acc"],
                     "Beta2PowOut": acc["beta2_pow_acc"]},
            attrs=self._op_attrs(param))


class AdamW(Adam):
    """``paddle.optimizer.AdamW``: Adam, and before it p *= 1 - lr * weight_decay for the
    parameters ``apply_decay_param_fun(name)`` accepts (default: all)."""

    type = "adamw"

    def __init__(self, learning_rate=0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, parameters=None, weight_decay: float = 0.01,
                 lr_ratio: Callable | None = None,
                 apply_decay_param_fun: Callable[[str], bool] | None = None,
                 grad_clip=None, lazy_mode: bool = False, multi_precision: bool = False,
                 name=None) -> None:
        coeff = check_float("AdamW", "weight_decay", weight_decay, 0.0)
        super().__init__(learning_rate, beta1, beta2, epsilon, parameters, None, grad_clip,
                         name=name)
        self._coeff = coeff
        self._lr_ratio = lr_ratio
        self._apply_decay_param_fun = apply_decay_param_fun

    def _op_attrs(self, param) -> dict:
        decay = self._apply_decay_param_fun is None or self._apply_decay_param_fun(param.name)
        ratio = float(self._lr_ratio(param)) if self._lr_ratio is not None else 1.0
        return {**super()._op_attrs(param), "coeff": self._coeff, "with_decay": bool(decay),
                "lr_ratio": ratio}


class Lamb(Adam):
    """``paddle.optimizer.Lamb``: r = m_hat / (sqrt(v_hat) + eps) + wd * p;
    p -= lr * (|p| / |r|) * r (ratio 1 when either norm is 0)."""

    type = "lamb"

    def __init__(self, learning_rate=0.001, lamb_weight_decay: float = 0.01,
                 beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-6,
                 parameters=None, grad_clip=None,
                 exclude_from_weight_decay_fn: Callable[[object], bool] | None = None,
                 multi_precision: bool = False, name=None) -> None:
        super().__init__(learning_rate, beta1, beta2, epsilon, parameters, None, grad_clip,
                         name=name)
        self._lamb_weight_decay = check_float("Lamb", "lamb_weight_decay",
                                              lamb_weight_decay, 0.0)
        self._exclude_fn = exclude_from_weight_decay_fn

    def _op_attrs(self, param) -> dict:
        wd = self._lamb_weight_decay
        if self._exclude_fn is not None and self._exclude_fn(param):
            wd = 0.0
        return {**super()._op_attrs(param), "weight_decay": wd}
