"""``TensorParallelOptimizer``: Paddle's tensor-parallel meta-optimizer (reference
paddle-semantics.md 4.5). Its rewrite passes live in ``tp_passes``."""

from __future__ import annotations

from ...framework.program import default_startup_program
from . import tp_passes as passes
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
        # with sharding on too, ShardingOptimizer runs this rewrite with its own rings
        strategy = self.user_defined_strategy
        return bool(self.role_maker._is_collective and strategy.tensor_parallel
                    and not (strategy.sharding and self.role_maker._worker_num() > 1))

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
        """The inner minimize, then the rewrite of reference 4.5: rings and parameter
        broadcasts in the startup program; with data parallelism (world > degree) the
        loss-gradient scale and the gradient all-reduces in the main program; with model
        parallelism (degree > 1) the clip-norm all-reduce and whole-parameter trust ratios;
        with mixed precision (AMP inside) the found-inf flag's max over the mp and dp rings.
        A bad degree fails before any program changes."""
        endpoints = list(self.role_maker._get_trainer_endpoints())
        rank = self.role_maker._worker_index()
        self.mp_degree = passes.check_degree(self.mp_degree, len(endpoints))
        main = loss.block.program
        passes.check_partitions(main.global_block(), self.mp_degree)
        startup = startup_program if startup_program is not None \
            else default_startup_program()
        result = self.inner_opt.minimize(loss, startup, parameter_list, no_grad_set)
        groups = passes.ProcessGroups(rank, tuple(endpoints), self.mp_degree)
        self._init_process_group(startup.global_block(), groups)
        block = main.global_block()
        if groups.nranks > self.mp_degree:
            passes.insert_loss_grad_scale(block, groups.dp_degree, self._scale_strategy())
            passes.insert_grad_allreduce(block, self.dp_ring_id)
        if self.mp_degree > 1:
            passes.insert_clip_norm_allreduce(block, self.mp_ring_id)
            passes.mark_sharded_updates(block, self.mp_ring_id)
        passes.insert_found_inf_allreduce(block, [
            ring for ring, used in ((self.mp_ring_id, self.mp_degree > 1),
                                    (self.dp_ring_id, groups.nranks > self.mp_degree)) if used])
        return result

    def _init_process_group(self, startup_block, groups: passes.ProcessGroups) -> None:
        """Rings global 1, mp 0 (then broadcast the replicated parameters over it) and, with
        data parallelism, dp 2 (then broadcast every parameter over it), in Paddle's order."""
        passes.init_communicator(startup_block, groups.endpoints, groups.rank,
                                 self.global_ring_id, self.global_ring_id)
        passes.init_communicator(startup_block, groups.mp_endpoints, groups.mp_rank,
                                 self.mp_ring_id, self.global_ring_id)
        passes.broadcast_params(startup_block, self.mp_ring_id, skip_distributed=True)
        if groups.nranks > self.mp_degree:
            passes.init_communicator(startup_block, groups.dp_endpoints, groups.dp_rank,
                                     self.dp_ring_id, self.global_ring_id)
            passes.broadcast_params(startup_block, self.dp_ring_id, skip_distributed=False)
