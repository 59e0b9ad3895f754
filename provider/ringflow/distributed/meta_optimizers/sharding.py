"""``ShardingOptimizer``: fleet's ``sharding`` strategy (Paddle's static sharding_optimizer.py;
DeepSpeed's ZeRO stages 1 and 2 are the same idea). The ranks of a sharding group (the
data-parallel ranks: every ``mp``-th one) split the parameters between them by bytes
(``shard_layout``): each rank updates only its own and holds only their optimizer state;
every gradient is reduced to its owner and every parameter broadcast from it after the
update (the executor runs a bucket's reductions as one reduce-scatter and the broadcasts
as one all-gather: compiler/buckets.py, compiler/param_gather.py).

``sharding_configs``: ``sharding_degree`` (default: the data-parallel degree, world / mp;
Paddle's default is 8 and must be given), ``stage`` 1 (optimizer state sharded) or 2 (the
gradients too: the executor keeps only the owner's reduced part of each gradient bucket),
``mp_degree`` (tensor parallelism inside, Paddle's hybrid form; ``strategy.tensor_parallel``
with its degree is the same). Not supported here, and ConfigErrors: stage 3,
``pp_degree`` > 1, ``dp_degree`` > 1 (an outer data-parallel level), gradient merge,
``optimize_offload``. Paddle's other fields (segment strategy and sizes, anchors,
``hybrid_dp``, ``optimize_cast``, ...) are accepted and change nothing: the broadcasts are
one all-gather at the end of the step.

Rings, Paddle's sharding ids: mp 0, sharding 1, global 3.
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...framework.program import default_startup_program
from ..shard_layout import shard_owners
from ..strategy import DistributedStrategy
from . import sharding_passes as sp
from . import tp_passes as passes
from .base import MetaOptimizerBase


class ShardingOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer) -> None:
        super().__init__(optimizer)
        self.meta_optimizers_white_list = [
            "RecomputeOptimizer", "AMPOptimizer", "LarsOptimizer", "LambOptimizer"]
        self.meta_optimizers_black_list = ["GraphExecutionOptimizer"]
        self.mp_ring_id, self.sharding_ring_id, self.global_ring_id = 0, 1, 3
        self.mp_degree = 1
        self.sharding_degree = 1
        self.stage = 1
        self.owners: dict[str, int] = {}

    def _set_basic_info(self, loss, role_maker, user_defined_optimizer,
                        user_defined_strategy) -> None:
        super()._set_basic_info(loss, role_maker, user_defined_optimizer,
                                user_defined_strategy)
        strategy = user_defined_strategy
        if strategy.sharding and strategy.tensor_parallel:
            # both set: sharding runs the tensor-parallel rewrite too (Paddle's hybrid form)
            degree = strategy.tensor_parallel_configs["tensor_parallel_degree"]
            given = strategy.sharding_configs["mp_degree"]
            if strategy._was_given("sharding_configs", "mp_degree") and given != degree:
                raise ConfigError(f"sharding_configs['mp_degree']={given} differs from "
                                  f"tensor_parallel_degree={degree}")
            strategy.sharding_configs = {"mp_degree": degree}

    def _can_apply(self) -> bool:
        return bool(self.role_maker._is_collective and self.role_maker._worker_num() > 1
                    and self.user_defined_strategy.sharding)

    def _disable_strategy(self, dist_strategy) -> None:
        dist_strategy.sharding = False
        dist_strategy.sharding_configs = DistributedStrategy().sharding_configs
        dist_strategy._given["sharding_configs"].clear()

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        dist_strategy.sharding = True
        dist_strategy.sharding_configs = {"segment_broadcast_MB": 32.0}

    # -----------------------------------------------------------------------------------
    def _degrees(self, world: int) -> tuple[int, int, int]:
        """(mp degree, sharding degree, stage) of the strategy, checked against the world
        before any program changes."""
        strategy = self.user_defined_strategy
        configs = strategy.sharding_configs
        for key, why in (("pp_degree", "pipeline parallelism"),
                         ("dp_degree", "a data-parallel level outside the sharding groups"),
                         ("gradient_merge_acc_step", "gradient merge")):
            if configs[key] > 1:
                raise ConfigError(f"sharding_configs['{key}']={configs[key]}: {why} is not "
                                  "supported by ringflow's sharding")
        if configs["optimize_offload"]:
            raise ConfigError("sharding_configs['optimize_offload']: offloading optimizer "
                              "state to host memory has no meaning on a CPU")
        if configs["stage"] not in (1, 2):
            raise ConfigError(f"sharding_configs['stage'] must be 1 (optimizer state) or 2 "
                              f"(and gradients), got {configs['stage']}: stage 3 (parameters "
                              "sharded too) is not supported")
        mp = passes.check_degree(strategy._mp_degree() or 1, world)
        dp = world // mp
        degree = configs["sharding_degree"] if strategy._was_given(
            "sharding_configs", "sharding_degree") else dp
        if degree != dp:
            raise ConfigError(f"sharding_degree={degree} x mp_degree={mp} must be the world "
                              f"size {world}: sharding groups are the data-parallel ranks "
                              f"(sharding_degree {dp})")
        return mp, degree, configs["stage"]

    def minimize_impl(self, loss, startup_program=None, parameter_list=None,
                      no_grad_set=None):
        endpoints = list(self.role_maker._get_trainer_endpoints())
        rank = self.role_maker._worker_index()
        self.mp_degree, self.sharding_degree, self.stage = self._degrees(len(endpoints))
        main = loss.block.program
        passes.check_partitions(main.global_block(), self.mp_degree)
        startup = startup_program if startup_program is not None \
            else default_startup_program()
        result = self.inner_opt.minimize(loss, startup, parameter_list, no_grad_set)
        groups = passes.ProcessGroups(rank, tuple(endpoints), self.mp_degree)
        self._init_process_group(startup.global_block(), groups)
        self._shard_main(main.global_block(), startup.global_block(), groups.dp_rank,
                         result[1] if isinstance(result, tuple) else [])
        return result

    def _init_process_group(self, sblock, groups: passes.ProcessGroups) -> None:
        """Rings global 3, mp 0 (with the replicated parameters' broadcast) and sharding 1
        (every parameter broadcast from its rank 0)."""
        g = self.global_ring_id
        passes.init_communicator(sblock, groups.endpoints, groups.rank, g, g)
        if self.mp_degree > 1:
            passes.init_communicator(sblock, groups.mp_endpoints, groups.mp_rank,
                                     self.mp_ring_id, g)
            passes.broadcast_params(sblock, self.mp_ring_id, skip_distributed=True)
        passes.init_communicator(sblock, groups.dp_endpoints, groups.dp_rank,
                                 self.sharding_ring_id, g)
        passes.broadcast_params(sblock, self.sharding_ring_id, skip_distributed=False)

    def _shard_main(self, block, sblock, shard_rank: int, params_grads) -> None:
        ring, mp_ring = self.sharding_ring_id, self.mp_ring_id
        passes.insert_loss_grad_scale(block, self.sharding_degree, self._scale_strategy())
        order = sp.reduced_grads(block)
        weights = [_nbytes(block.var(p)) for _, p, _ in order]
        self.owners = dict(zip([p for _, p, _ in order],
                               shard_owners(weights, self.sharding_degree)))
        sp.insert_grad_reduce(block, ring, self.owners, self.stage)
        others = {p for p, o in self.owners.items() if o != shard_rank}
        other_grads = {g for _, p, g in order if p in others} | {
            g.name for p, g in params_grads if p.name in others}
        sp.prune_other_shards(block, sblock, others, other_grads)
        if self.mp_degree > 1:   # (before the group's: it all-reduces every writer)
            passes.insert_clip_norm_allreduce(block, mp_ring)
            passes.mark_sharded_updates(block, mp_ring)
        sp.insert_clip_sum_allreduce(block, ring)
        passes.insert_found_inf_allreduce(block, [mp_ring] * (self.mp_degree > 1) + [ring])
        sp.insert_param_broadcast(block, ring, [p for _, p, _ in order], self.owners)


def _nbytes(var) -> int:
    return int(np.prod(var.shape)) * np.dtype(var.dtype).itemsize
