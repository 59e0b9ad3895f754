"""Optimizers (``paddle.optimizer`` names): they append update ops with role Optimize to
the main program and initialise their state in the startup program; ``lr`` holds the
learning-rate schedulers, ``ClipGradByGlobalNorm`` the in-program gradient clipping."""

from . import lr
from .adam import Adam, AdamW, Lamb
from .clip import ClipGradByGlobalNorm
from .momentum import Lars, LarsMomentum, LarsMomentumOptimizer, Momentum
from .optimizer import L2Decay, Optimizer
from .sgd import SGD

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "ClipGradByGlobalNorm",
    "L2Decay",
    "Lamb",
    "Lars",
    "LarsMomentum",
    "LarsMomentumOptimizer",
    "Momentum",
    "Optimizer",
    "lr",
]
