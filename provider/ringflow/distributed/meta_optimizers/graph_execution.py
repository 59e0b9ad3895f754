"""``GraphExecutionOptimizer``: plain data parallelism, the graph optimizer at the end of
fleet's chain (the role of Paddle's GraphExecutionOptimizer, whose ParallelExecutor
all-reduces every gradient, written in the program form of Paddle's RawProgramOptimizer).

It applies to a collective job of more than one rank when neither ``tensor_parallel`` nor
``sharding`` is set (those data-parallelise the program themselves): after the chain has
appended backward and update ops, the startup program gets ring 0 over every rank and a
broadcast of every parameter from rank 0, and the main program the loss-gradient scale
1/world, a ``c_allreduce_sum`` per gradient on ring 0 and, with mixed precision, the
found-inf flag's max over ring 0. So every rank keeps the same parameters.
"""

from __future__ import annotations

from ...framework.program import default_startup_program
from . import tp_passes as passes
from .base import MetaOptimizerBase


class GraphExecutionOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.meta_optimizers_white_list = []
        self.meta_optimizers_black_list = []
        self.global_ring_id = 0

    def _is_graph_out(self) -> bool:
        return True

    def _can_apply(self) -> bool:
        strategy = self.user_defined_strategy
        return bool(self.role_maker._is_collective and self.role_maker._worker_num() > 1
                    and not strategy.tensor_parallel and not strategy.sharding)

    def _disable_strategy(self, dist_strategy) -> None:
        return  # no strategy flag of its own

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        return

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        """Data-parallelises the programs the chain has built (it appends no backward or
        update ops of its own); returns nothing, as Paddle's graph optimizers."""
        endpoints = list(self.role_maker._get_trainer_endpoints())
        rank = self.role_maker._worker_index()
        startup = startup_program if startup_program is not None \
            else default_startup_program()
        sblock, block = startup.global_block(), loss.block.program.global_block()
        ring = self.global_ring_id
        passes.init_communicator(sblock, endpoints, rank, ring, ring)
        passes.broadcast_params(sblock, ring, skip_distributed=False)
        passes.insert_loss_grad_scale(block, len(endpoints), self._scale_strategy())
        passes.insert_grad_allreduce(block, ring)
        passes.insert_found_inf_allreduce(block, [ring])
        return None, None
