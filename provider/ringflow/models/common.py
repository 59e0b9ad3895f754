"""What a model builder returns, and the checks builders share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..framework.program import Variable


@dataclass
class BuiltModel:
    """``loss`` (shape [1]); ``feeds``: the data variables' names, in order;
    ``make_batch(seed, step, batch_size)``: the synthetic global batch of a step, a dict of
    arrays named as the feeds, a pure function of its arguments (not of the layout);
    ``config``: the builder's arguments; ``checkpoints``: the names of the model's natural
    recompute checkpoints (block outputs), in forward order; ``outputs``: names of variables
    evaluation reads, ``sample_loss`` (the loss of each scored position, [N, 1]: a row of
    a classifier, a token of a language model), ``logits`` (a tensor-parallel language
    model's are this rank's vocabulary slice) and, for a classifier, ``labels``: the feed
    of the classes, so evaluation reports the accuracy of argmax(logits) [N, classes]."""

    loss: Variable
    feeds: list[str]
    make_batch: Callable[[int, int, int], dict[str, np.ndarray]]
    config: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)


def check_positive(model: str, **values: Any) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{model}: {key} must be an integer >= 1, got {value!r}")


def check_divides(model: str, divisor: str, value: int, **values: int) -> None:
    """Every size in ``values`` must split evenly by ``divisor`` (named, = ``value``)."""
    for key, size in values.items():
        if size % value:
            raise ConfigError(f"{model}: {key}={size} is not divisible by {divisor}={value}")


def check_float_dtype(model: str, dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in ("float32", "float64"):
        raise ConfigError(f"{model}: dtype must be float32 or float64, got {name}")
    return name


def batch_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of one step's global batch: the same on every rank and layout."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(step), 0x5EED])
