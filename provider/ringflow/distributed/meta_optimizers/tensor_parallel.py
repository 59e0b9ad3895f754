"""``TensorParallelOptimizer``: Paddle's tensor-parallel meta-optimizer (reference
paddle-semantics.md 4.5). Its rewrite passes live in ``tp_passes``."""

from __future__ import annotations

from .base import MetaOptimizerBase


class TensorParallelOptimizer(MetaOptimizerBase):
    """Rings mp 0 (contiguous rank blocks), global 1, dp 2 (strided); parameters broadcast,
    the loss gradient scaled by 1/dp and gradients all-reduced over the dp ring."""

    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.meta_optimizers_white_list = [
            "RecomputeOptimizer", "AMPOptimizer", "LarsOptimizer", "LambOptimizer"]
        self.meta_optimizers_black_list = []
        self.mp_ring_id = 0
        self.global_ring_id = 1
        self.dp_ring_id = 2
        self.mp_degree = 1

    def _set_basic_info(self, loss, role_maker, user_defined_optimizer,
                        user_defined_strategy) -> None:
        super()._set_basic_info(loss, role_maker, user_defined_optimizer,
                                user_defined_strategy)
        self.mp_degree = user_defined_strategy.tensor_parallel_configs[
            "tensor_parallel_degree"]

    def _can_apply(self) -> bool:
        return bool(self.role_maker._is_collective
                    and self.user_defined_strategy.tensor_parallel)

    def _disable_strategy(self, dist_strategy) -> None:
        # Not the seed's ``= {}`` (a no-op merge): the degree really goes back to 1.
        dist_strategy.tensor_parallel = False
        dist_strategy.tensor_parallel_configs = {"tensor_parallel_degree": 1,
                                                 "tensor_init_seed": -1}

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        dist_strategy.tensor_parallel = True
        dist_strategy.tensor_parallel_configs = {"tensor_parallel_degree": 1}

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        # The rewrite (tp_passes) is being written; until then this is the inner minimize.
        return self.inner_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
