"""``MetaOptimizerBase``: what every fleet meta-optimizer is (Paddle's interface, reference
paddle-semantics.md 2.1). A meta-optimizer wraps an inner optimizer (the user's, or another
meta-optimizer of the chain) and rewrites the programs around the inner ``minimize``.
"""

from __future__ import annotations

from typing import Any


class MetaOptimizerBase:
    """Delegates everything to ``inner_opt``; subclasses override ``_can_apply``,
    ``_disable_strategy``, ``_enable_strategy`` and ``minimize_impl``.

    ``meta_optimizers_white_list`` names the meta-optimizer classes this one may wrap (the
    strategy compiler chains along it); ``meta_optimizers_black_list`` the graph optimizers
    it excludes."""

    def __init__(self, optimizer: Any) -> None:
        # As Paddle: no super().__init__; the learning rate is the inner optimizer's.
        self.inner_opt = optimizer
        self._learning_rate = getattr(optimizer, "_learning_rate", None)
        self._learning_rate_map = getattr(optimizer, "_learning_rate_map", {})
        self.meta_optimizers_white_list: list[str] = []
        self.meta_optimizers_black_list: list[str] = []
        self.loss = None
        self.role_maker = None
        self.user_defined_optimizer = None
        self.user_defined_strategy = None

    def _set_basic_info(self, loss, role_maker, user_defined_optimizer,
                        user_defined_strategy) -> None:
        self.loss = loss
        self.role_maker = role_maker
        self.user_defined_optimizer = user_defined_optimizer
        self.user_defined_strategy = user_defined_strategy

    def _scale_strategy(self) -> str:
        """How the loss gradient is scaled for data parallelism (Paddle's
        ``gradient_scale_configs["scale_strategy"]``: avg, sum or customized)."""
        strategy = self.user_defined_strategy
        return "avg" if strategy is None else strategy.gradient_scale_configs["scale_strategy"]

    def _update_inner_optimizer(self, optimizer: Any) -> None:
        self.inner_opt = optimizer

    def _can_apply(self) -> bool:
        return False

    def _is_graph_out(self) -> bool:
        return False

    def _can_update(self, optimizer: Any) -> bool:
        """True when this meta-optimizer may wrap ``optimizer`` (its class is white-listed)."""
        return type(optimizer).__name__ in self.meta_optimizers_white_list

    def _disable_strategy(self, dist_strategy) -> None:
        raise NotImplementedError(
            f"you should implement disable strategy in {type(self).__name__}")

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        raise NotImplementedError(
            f"you should implement enable strategy in {type(self).__name__}")

    # delegation to the inner optimizer ---------------------------------------------------
    def apply_gradients(self, params_grads):
        return self.inner_opt.apply_gradients(params_grads)

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        return self.inner_opt.backward(loss, startup_program, parameter_list, no_grad_set,
                                       callbacks)

    def apply_optimize(self, loss, startup_program, params_grads):
        return self.inner_opt.apply_optimize(loss, startup_program, params_grads)

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        optimize_ops = self.apply_optimize(loss, startup_program, params_grads)
        return optimize_ops, params_grads

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        return self.minimize_impl(loss, startup_program, parameter_list, no_grad_set)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(inner_opt={self.inner_opt!r})"
