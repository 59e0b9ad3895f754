"""``LarsOptimizer``: with ``strategy.lars`` on, the user's Momentum is trained as LARS
momentum (Paddle's lars_optimizer.py): its learning rate, momentum, parameters, L2 decay,
clip and name, with the strategy's ``lars_coeff``, ``lars_weight_decay`` and ``epsilon``; a
parameter whose name contains one of ``exclude_from_weight_decay`` gets no LARS decay."""

from __future__ import annotations

import logging

from ...optimizer.momentum import LarsMomentum, Momentum
from ...optimizer.optimizer import Optimizer
from ..strategy import DistributedStrategy
from .base import MetaOptimizerBase
from .lamb import inner_type

log = logging.getLogger("ringflow.distributed")


class LarsOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.lars_opt: Optimizer | None = None
        self.meta_optimizers_white_list = ["GraphExecutionOptimizer"]
        self.meta_optimizers_black_list = []

    def _set_basic_info(self, loss, role_maker, user_defined_optimizer,
                        user_defined_strategy) -> None:
        super()._set_basic_info(loss, role_maker, user_defined_optimizer,
                                user_defined_strategy)
        opt = self.inner_opt
        if not isinstance(opt, Momentum):
            return
        configs = user_defined_strategy.lars_configs
        self.lars_opt = LarsMomentum(
            learning_rate=opt._learning_rate, momentum=opt._momentum,
            lars_coeff=configs["lars_coeff"], lars_weight_decay=configs["lars_weight_decay"],
            parameters=opt._parameter_list, weight_decay=opt._decay, grad_clip=opt._grad_clip,
            name=opt._name, exclude_from_weight_decay=configs["exclude_from_weight_decay"],
            epsilon=configs["epsilon"])

    def _can_apply(self) -> bool:
        if not self.role_maker._is_collective or not self.user_defined_strategy.lars:
            return False
        if not isinstance(self.inner_opt, Momentum):
            log.warning("[rank %d] fleet: lars needs the inner optimizer to be Momentum, got "
                        "%s: lars is not applied", self.role_maker._worker_index(),
                        inner_type(self.inner_opt))
            return False
        return True

    def _disable_strategy(self, dist_strategy) -> None:
        dist_strategy.lars = False
        dist_strategy.lars_configs = DistributedStrategy().lars_configs

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        dist_strategy.lars = True
        dist_strategy.lars_configs = {"lars_coeff": 0.01, "lars_weight_decay": 0.0005}

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        return self.lars_opt.backward(loss, startup_program, parameter_list, no_grad_set,
                                      callbacks)

    def apply_gradients(self, params_grads):
        return self.lars_opt.apply_gradients(params_grads)

    def apply_optimize(self, loss, startup_program, params_grads):
        return self.lars_opt.apply_optimize(loss, startup_program, params_grads)

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        return self.lars_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
