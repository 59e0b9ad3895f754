"""``AMPOptimizer``: with ``strategy.amp`` on, the chain below it trains with automatic mixed
precision (Paddle's amp_optimizer.py over ``ringflow.amp.decorate``): ``amp_configs``'
init_loss_scaling, incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio, decr_ratio,
use_dynamic_loss_scaling and the custom white and black lists."""

from __future__ import annotations

from ...amp import AutoMixedPrecisionLists, OptimizerWithMixedPrecision, decorate
from ..strategy import DistributedStrategy
from .base import MetaOptimizerBase


class AMPOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.wrapped_opt: OptimizerWithMixedPrecision | None = None
        self.meta_optimizers_white_list = ["LarsOptimizer", "LambOptimizer",
                                           "RecomputeOptimizer", "GraphExecutionOptimizer"]
        self.meta_optimizers_black_list = ["DGCOptimizer"]

    def _init_wrapped_opt(self) -> OptimizerWithMixedPrecision:
        if self.wrapped_opt is None:
            config = self.user_defined_strategy.amp_configs
            lists = AutoMixedPrecisionLists(config["custom_white_list"],
                                            config["custom_black_list"])
            self.wrapped_opt = decorate(
                self.inner_opt, lists, config["init_loss_scaling"],
                config["incr_every_n_steps"], config["decr_every_n_nan_or_inf"],
                config["incr_ratio"], config["decr_ratio"], config["use_dynamic_loss_scaling"],
                config["use_pure_fp16"], config["use_fp16_guard"])
        return self.wrapped_opt

    def _can_apply(self) -> bool:
        return bool(self.role_maker._is_collective and self.user_defined_strategy.amp)

    def _disable_strategy(self, dist_strategy) -> None:
        dist_strategy.amp = False
        dist_strategy.amp_configs = DistributedStrategy().amp_configs

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        dist_strategy.amp = True
        dist_strategy.amp_configs = {
            "init_loss_scaling": 32768.0, "incr_every_n_steps": 1000,
            "decr_every_n_nan_or_inf": 2, "incr_ratio": 2.0, "decr_ratio": 0.8,
            "use_dynamic_loss_scaling": True}

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        return self._init_wrapped_opt().backward(loss, startup_program, parameter_list,
                                                 no_grad_set, callbacks)

    def apply_gradients(self, params_grads):
        return self.wrapped_opt.apply_gradients(params_grads)

    def apply_optimize(self, loss, startup_program, params_grads):
        return self.wrapped_opt.apply_optimize(loss, startup_program, params_grads)

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        return self._init_wrapped_opt().minimize(loss, startup_program, parameter_list,
                                                 no_grad_set)

    def get_loss_scaling(self):
        return self.wrapped_opt.get_loss_scaling()
