"""Automatic mixed precision for static programs (Paddle's ``paddle.static.amp``, level
O1): float16 compute for the white-listed ops, float32 master weights, dynamic loss
scaling, and a step with non-finite gradients skipped. Fleet's ``AMPOptimizer``
(``strategy.amp``) applies it inside the meta-optimizer chain."""

from .decorator import OptimizerWithMixedPrecision, decorate
from .lists import AutoMixedPrecisionLists, CustomOpLists
from .rewrite import rewrite_program, update_role_var_grad

__all__ = ["AutoMixedPrecisionLists", "CustomOpLists", "OptimizerWithMixedPrecision",
           "decorate", "rewrite_program", "update_role_var_grad"]
