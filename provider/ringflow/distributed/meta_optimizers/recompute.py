"""``RecomputeOptimizer``: with ``strategy.recompute`` on, the backward pass recomputes the
forward ops between ``recompute_configs["checkpoints"]`` (variable names) instead of
keeping their activations (Paddle's recompute_optimizer.py over
``append_backward(..., checkpoints=...)``); the update is the inner optimizer's."""

from __future__ import annotations

from ...backward import append_backward
from ...errors import ConfigError
from ..strategy import DistributedStrategy
from .base import MetaOptimizerBase


class RecomputeOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.meta_optimizers_white_list = ["LarsOptimizer", "LambOptimizer",
                                           "GraphExecutionOptimizer", "DGCOptimizer"]
        self.meta_optimizers_black_list = []

    def _checkpoints(self) -> list[str]:
        return list(self.user_defined_strategy.recompute_configs["checkpoints"])

    def _can_apply(self) -> bool:
        # as Paddle: recompute without checkpoints does not apply
        return bool(self.role_maker._is_collective and self.user_defined_strategy.recompute
                    and self._checkpoints())

    def _disable_strategy(self, dist_strategy) -> None:
        dist_strategy.recompute = False
        dist_strategy.recompute_configs = DistributedStrategy().recompute_configs

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        # as Paddle: checkpoints are not chosen automatically, so auto does not turn it on
        return

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        if self.user_defined_strategy.recompute_configs["enable_offload"]:
            raise ConfigError("recompute: enable_offload (checkpoints in host memory) has no "
                              "meaning on a CPU and is not supported")
        if parameter_list is None:
            parameter_list = getattr(self.user_defined_optimizer, "_parameter_list", None)
        return append_backward(loss, parameter_list, no_grad_set, callbacks,
                               checkpoints=self._checkpoints())

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        optimize_ops = self.apply_optimize(loss, startup_program, params_grads)
        return optimize_ops, params_grads
