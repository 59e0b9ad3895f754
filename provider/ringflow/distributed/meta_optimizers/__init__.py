"""Fleet's meta-optimizers. ``META_OPTIMIZER_CLASSES`` are the candidates the strategy
compiler considers, in alphabetical order of their class names (Paddle takes them from
``dir()`` of its meta_optimizers package, so the order is alphabetical there too)."""

from .base import MetaOptimizerBase
from .tensor_parallel import TensorParallelOptimizer

META_OPTIMIZER_CLASSES = sorted([TensorParallelOptimizer], key=lambda c: c.__name__)

__all__ = ["META_OPTIMIZER_CLASSES", "MetaOptimizerBase", "TensorParallelOptimizer"]
