"""Built-in model builders, serial or tensor-parallel from one code path: ``mlp`` and
``transformer`` (a small decoder-only transformer). Each names every parameter explicitly,
the same at every degree, so a tensor-parallel build starts from the serial model's values,
and returns a ``BuiltModel``: the loss, the feed names, and a seeded synthetic batch
maker."""

from .common import BuiltModel
from .mlp import mlp
from .transformer import transformer

__all__ = ["BuiltModel", "mlp", "transformer"]
