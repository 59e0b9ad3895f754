"""Stand-in meta-optimizers for the compiler and fleet tests. They carry the class names
(the strategy compiler chains by class name) and the white lists of Paddle's AMP,
Recompute, Lars and Lamb optimizers, apply when their strategy feature is on, and append
nothing of their own to a program, so these tests state the chaining rules alone; the real
classes (ringflow.distributed.meta_optimizers) are tested in test_meta_optimizers.py."""

from __future__ import annotations

from ringflow.distributed.meta_optimizers import MetaOptimizerBase
from ringflow.distributed.strategy import DistributedStrategy

_DEFAULTS = DistributedStrategy()


class StandIn(MetaOptimizerBase):
    FEATURE = ""
    WHITE_LIST: tuple[str, ...] = ()

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.meta_optimizers_white_list = list(self.WHITE_LIST)

    def _can_apply(self) -> bool:
        return getattr(self.user_defined_strategy, self.FEATURE)

    def _disable_strategy(self, dist_strategy) -> None:
        setattr(dist_strategy, self.FEATURE, False)
        configs = f"{self.FEATURE}_configs"
        setattr(dist_strategy, configs, getattr(_DEFAULTS, configs))

    def _enable_strategy(self, dist_strategy, context=None) -> None:
        setattr(dist_strategy, self.FEATURE, True)


class AMPOptimizer(StandIn):
    FEATURE = "amp"
    WHITE_LIST = ("LarsOptimizer", "LambOptimizer", "RecomputeOptimizer")


class RecomputeOptimizer(StandIn):
    FEATURE = "recompute"
    WHITE_LIST = ("LarsOptimizer", "LambOptimizer")


class LambOptimizer(StandIn):
    FEATURE = "lamb"


class LarsOptimizer(StandIn):
    FEATURE = "lars"


class PingOptimizer(StandIn):
    """Wraps Pong, which wraps Ping: white lists with a cycle."""

    FEATURE = "amp"
    WHITE_LIST = ("PongOptimizer",)


class PongOptimizer(StandIn):
    FEATURE = "amp"
    WHITE_LIST = ("PingOptimizer",)


class GraphExecutionOptimizer(StandIn):
    """A graph optimizer (``_is_graph_out``), as Paddle's of that name."""

    FEATURE = "fuse_all_reduce_ops"

    def _is_graph_out(self) -> bool:
        return True

    def _disable_strategy(self, dist_strategy) -> None:
        dist_strategy.fuse_all_reduce_ops = False


class FirstInLineOptimizer(StandIn):
    """Applies with recompute; wraps nothing and nothing wraps it. Alphabetically before
    TensorParallelOptimizer, so when both apply it alone is used (no edge between them)."""

    FEATURE = "recompute"
