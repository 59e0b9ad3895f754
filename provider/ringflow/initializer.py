"""Parameter initializers: each appends ONE op to the startup block that writes the parameter.

Random initializers get the op's ``seed`` attr from the startup program's ``random_seed`` and
the parameter's name (``stable_seed``), never from the op's position: a rewrite that inserts
ops into the startup program later must not change initial values, and two builds with the
same ``random_seed`` give bitwise-identical parameters in every process.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ProgramError
from .framework.program import Block, Operator, Variable
from .seeds import stable_seed

__all__ = ["Constant", "Initializer", "Normal", "Uniform", "XavierNormal", "XavierUniform"]


class Initializer:
    """Base: ``init(var, block)`` appends the op that initialises ``var`` to ``block``."""

    def __call__(self, var: Variable, block: Block) -> Operator:
        if var.shape is None or any(d < 0 for d in var.shape):
            raise ProgramError(f"{type(self).__name__} cannot initialise {var.name!r}: its shape "
                               f"{list(var.shape or [])} is not fully known")
        op_type, attrs = self._op(var)
        attrs = {"shape": list(var.shape), "dtype": var.dtype, **attrs}
        shard = getattr(var, "shard", None)
        if shard is not None and "seed" in attrs:
            # A tensor-parallel shard: the op draws the whole parameter and keeps this piece,
            # so the shard is bitwise the slice of the serial model's parameter.
            attrs.update(full_shape=list(shard.full_shape), shard_axis=shard.axis,
                         shard_index=shard.index)
        return block.append_op(op_type, outputs={"Out": [var.name]}, attrs=attrs)

    def _op(self, var: Variable) -> tuple[str, dict]:
        raise NotImplementedError

    @staticmethod
    def _seed(var: Variable) -> int:
        # seed 0 means "unseeded" to the random ops, so a crc that happens to be 0 becomes 1.
        return stable_seed(var.block.program.random_seed, var.name) or 1

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Constant(Initializer):
    """Every element is ``value`` (``fill_constant``)."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = float(value)

    def _op(self, var: Variable) -> tuple[str, dict]:
        return "fill_constant", {"value": self.value}


class Normal(Initializer):
    """Gaussian N(mean, std^2) (``gaussian_random``)."""

    def __init__(self, mean: float = 0.0, std: float = 1.0) -> None:
        self.mean, self.std = float(mean), float(std)

    def _op(self, var: Variable) -> tuple[str, dict]:
        return "gaussian_random", {"mean": self.mean, "std": self.std, "seed": self._seed(var)}


class Uniform(Initializer):
    """Uniform on [low, high) (``uniform_random``)."""

    def __init__(self, low: float = -1.0, high: float = 1.0) -> None:
        if not low < high:
            raise ProgramError(f"Uniform needs low < high, got low={low}, high={high}")
        self.low, self.high = float(low), float(high)

    def _op(self, var: Variable) -> tuple[str, dict]:
        return "uniform_random", {"min": self.low, "max": self.high, "seed": self._seed(var)}


def compute_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """Paddle's fan_in, fan_out: [in, out] for a 2-D weight; for more dimensions (conv
    filters [out, in, k...]) the receptive field multiplies both."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = int(np.prod(shape[2:]))
    return shape[1] * receptive, shape[0] * receptive


class XavierUniform(Initializer):
    """Glorot uniform: U(-l, l) with l = sqrt(6 / (fan_in + fan_out)); the default for
    weights. ``fan_in``/``fan_out`` override the ones computed from the shape."""

    def __init__(self, fan_in: int | None = None, fan_out: int | None = None) -> None:
        self.fan_in, self.fan_out = fan_in, fan_out

    def _fans(self, var: Variable) -> tuple[int, int]:
        # a shard's fans are those of the whole parameter: the same limits as the serial model
        shard = getattr(var, "shard", None)
        fan_in, fan_out = compute_fans(shard.full_shape if shard is not None else var.shape)
        return self.fan_in or fan_in, self.fan_out or fan_out

    def _op(self, var: Variable) -> tuple[str, dict]:
        fan_in, fan_out = self._fans(var)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return "uniform_random", {"min": -limit, "max": limit, "seed": self._seed(var)}


class XavierNormal(XavierUniform):
    """Glorot normal: N(0, 2 / (fan_in + fan_out))."""

    def _op(self, var: Variable) -> tuple[str, dict]:
        fan_in, fan_out = self._fans(var)
        std = math.sqrt(2.0 / (fan_in + fan_out))
        return "gaussian_random", {"mean": 0.0, "std": std, "seed": self._seed(var)}


# Paddle's older spellings.
ConstantInitializer, NormalInitializer, UniformInitializer = Constant, Normal, Uniform
XavierInitializer = XavierUniform
