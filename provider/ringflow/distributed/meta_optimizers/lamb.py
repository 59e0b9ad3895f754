"""``LambOptimizer``: with ``strategy.lamb`` on, the user's Adam is trained as LAMB (Paddle's
lamb_optimizer.py): its learning rate, betas, epsilon, parameters, clip and name, with the
strategy's ``lamb_weight_decay``; a parameter whose name ends with one of
``exclude_from_weight_decay`` gets no decay."""

from __future__ import annotations

import logging

from ...optimizer.adam import Adam, Lamb
from ...optimizer.optimizer import Optimizer
from ..strategy import DistributedStrategy
from .base import MetaOptimizerBase

log = logging.getLogger("ringflow.distributed")


def _is_adam(opt) -> bool:
    # ringflow's Lamb subclasses Adam; it is not an Adam to turn into one
    return isinstance(opt, Adam) and not isinstance(opt, Lamb)


def exclude_by_suffix(suffixes: list[str]):
    """Paddle's exclude rule: a parameter whose name ends with one of ``suffixes``."""
    if not suffixes:
        return None
    ends = tuple(suffixes)
    return lambda param: param.name.endswith(ends)


def inner_type(opt) -> str:
    return getattr(opt, "type", "") or type(opt).__name__


class LambOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.lamb_opt: Optimizer | None = None
        # as Paddle: no meta-optimizer runs inside it
        self.meta_optimizers_white_list = []
        self.meta_optimizers_black_list = []

    def _set_basic_info(self, loss, role_maker, user_defined_optimizer,
                        user_defined_strategy) -> None:
        super()._set_basic_info(loss, role_maker, user_defined_optimizer,
                                user_defined_strategy)
        opt = self.inner_opt
        if not _is_adam(opt):
            return
        configs = user_defined_strategy.lamb_configs
        self.lamb_opt = Lamb(
            learning_rate=opt._learning_rate, lamb_weight_decay=configs["lamb_weight_decay"],
            beta1=opt._beta1, beta2=opt._beta2, epsilon=opt._epsilon,
            parameters=opt._parameter_list, grad_clip=opt._grad_clip,
            exclude_from_weight_decay_fn=exclude_by_suffix(configs["exclude_from_weight_decay"]),
            name=opt._name)

    def _can_apply(self) -> bool:
        if not self.role_maker._is_collective or not self.user_defined_strategy.lamb:
            return False
        if not _is_adam(self.inner_opt):
            log.warning("[rank %d] fleet: lamb needs the inner optimizer to be Adam, got %s: "
                        "lamb is not applied", self.role_maker._worker_index(),
                        inner_type(self.inner_opt))
            return False
        return True

    def _disable_strategy(self, dist_strategy) -> None:
        # Not Paddle's ``= {}`` (a no-op merge): the configs really go back to the defaults.
        dist_strategy.lamb = False
        dist_strategy.lamb_configs = DistributedStrategy().lamb_configs

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        dist_strategy.lamb = True
        dist_strategy.lamb_configs = {"lamb_weight_decay": 0.01, "exclude_from_weight_decay": []}

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        return self.lamb_opt.backward(loss, startup_program, parameter_list, no_grad_set,
                                      callbacks)

    def apply_gradients(self, params_grads):
        return self.lamb_opt.apply_gradients(params_grads)

    def apply_optimize(self, loss, startup_program, params_grads):
        return self.lamb_opt.apply_optimize(loss, startup_program, params_grads)

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        return self.lamb_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
