"""Plain stochastic gradient descent: ``param -= lr * grad`` (op ``sgd``)."""

from __future__ import annotations

from .optimizer import Optimizer


class SGD(Optimizer):
    """``paddle.optimizer.SGD``."""

    type = "sgd"

    def __init__(self, learning_rate=0.001, parameters=None, weight_decay=None,
                 grad_clip=None, multi_precision: bool = False, name=None) -> None:
        super().__init__(learning_rate, parameters, weight_decay, grad_clip, name)

    def _append_optimize_op(self, block, param_and_grad):
        param, grad = param_and_grad
        return block.append_op(
            self.type,
            inputs={"Param": param, "Grad": grad,
                    "LearningRate": self._create_param_lr(param_and_grad)},
            outputs={"ParamOut": param})
