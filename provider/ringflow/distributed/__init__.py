"""ringflow.distributed: Paddle's collective API on numpy arrays, fleet (strategy, role
makers, the meta-optimizer chain with TensorParallelOptimizer) and the tensor-parallel layers
``split`` and ``parallel_cross_entropy``. Names load lazily (PEP 562), so importing this
package costs nothing until used."""

from __future__ import annotations

from .._lazy import Exports, lazy_exports

_API = "ringflow.distributed.collective.api"
_REG = "ringflow.distributed.collective.registry"
_EXPORTS: Exports = {
    **{name: (_API, name) for name in (
        "init_parallel_env", "is_initialized", "get_rank", "get_world_size", "new_group",
        "get_group", "Group", "all_reduce", "broadcast", "reduce", "all_gather",
        "reduce_scatter", "send", "recv", "barrier", "destroy_process_group")},
    "ReduceOp": ("ringflow.distributed.collective.reduce_op", "ReduceOp"),
    "init_ring": (_REG, "init_ring"),
    "get_ring": (_REG, "get_ring"),
    "destroy_ring": (_REG, "destroy_ring"),
    "Communicator": ("ringflow.distributed.collective.communicator", "Communicator"),
    "collective": ("ringflow.distributed.collective", None),
    "env": ("ringflow.distributed.env", None),
    "fleet": ("ringflow.distributed.fleet", None),
    "DistributedStrategy": ("ringflow.distributed.strategy", "DistributedStrategy"),
    "PaddleCloudRoleMaker": ("ringflow.distributed.role_maker", "PaddleCloudRoleMaker"),
    "UserDefinedRoleMaker": ("ringflow.distributed.role_maker", "UserDefinedRoleMaker"),
    "split": ("ringflow.distributed.parallel_layers", "split"),
    "parallel_cross_entropy": ("ringflow.distributed.parallel_layers", "parallel_cross_entropy"),
    "meta_optimizers": ("ringflow.distributed.meta_optimizers", None),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports('ringflow.distributed', globals(), _EXPORTS)
