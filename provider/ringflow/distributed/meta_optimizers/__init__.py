"""Fleet's meta-optimizers. ``META_OPTIMIZER_CLASSES`` are the candidates the strategy
compiler considers, in alphabetical order of their class names (Paddle takes them from
``dir()`` of its meta_optimizers package, so the order is alphabetical there too)."""

from .amp import AMPOptimizer
from .base import MetaOptimizerBase
from .graph_execution import GraphExecutionOptimizer
from .lamb import LambOptimizer
from .lars import LarsOptimizer
from .recompute import RecomputeOptimizer
from .sharding import ShardingOptimizer
from .tensor_parallel import TensorParallelOptimizer

META_OPTIMIZER_CLASSES = sorted(
    [AMPOptimizer, GraphExecutionOptimizer, LambOptimizer, LarsOptimizer, RecomputeOptimizer,
     ShardingOptimizer, TensorParallelOptimizer],
    key=lambda c: c.__name__)

__all__ = ["META_OPTIMIZER_CLASSES", "AMPOptimizer", "GraphExecutionOptimizer", "LambOptimizer",
           "LarsOptimizer", "MetaOptimizerBase", "RecomputeOptimizer", "ShardingOptimizer",
           "TensorParallelOptimizer"]
