"""Learning-rate schedulers (``paddle.optimizer.lr`` names and semantics).

A scheduler passed to an optimizer is attached to the main program
(``Program.lr_scheduler``, with ``var_name`` = the learning-rate variable): before each run
the executor writes ``sched()`` into that variable, after each run it calls ``step()``.
Used by hand, ``sched()`` is the current rate and ``step()`` moves to the next epoch/step.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from ..errors import ConfigError

__all__ = [
    "CosineAnnealingDecay",
    "ExponentialDecay",
    "LRScheduler",
    "LinearWarmup",
    "MultiStepDecay",
    "StepDecay",
]


class LRScheduler:
    """Base: ``get_lr()`` computes the rate for ``last_epoch``; ``step()`` advances it.

    Construction performs the first ``step()``, so ``last_epoch`` starts at 0 and
    ``last_lr`` is the rate of step 0, as in Paddle.
    """

    def __init__(self, learning_rate: float = 0.1, last_epoch: int = -1,
                 verbose: bool = False) -> None:
        if not isinstance(learning_rate, (int, float)):
            raise ConfigError(f"{type(self).__name__}: learning_rate must be a number, "
                              f"got {type(learning_rate).__name__}")
        self.base_lr = float(learning_rate)
        self.last_lr = float(learning_rate)
        self.last_epoch = last_epoch
        self.verbose = verbose
        # The program variable this scheduler feeds (set by the optimizer).
        self.var_name: str | None = None
        self.step()

    def __call__(self) -> float:
        return self.last_lr

    def step(self, epoch: int | None = None) -> None:
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        self.last_lr = float(self.get_lr())
        if self.verbose:
            print(f"Epoch {self.last_epoch}: {type(self).__name__} set learning rate "
                  f"to {self.last_lr}.")

    def get_lr(self) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def state_keys(self) -> list[str]:
        return ["last_epoch", "last_lr"]

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.state_keys()}

    def set_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = [k for k in self.state_keys() if k not in state_dict]
        if missing:
            raise ConfigError(f"{type(self).__name__}.set_state_dict: missing keys {missing}, "
                              f"got {sorted(state_dict)}")
        for k in self.state_keys():
            setattr(self, k, state_dict[k])

    set_dict = set_state_dict


def _check_positive_int(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


class StepDecay(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, learning_rate: float, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1, verbose: bool = False) -> None:
        self.step_size = _check_positive_int("StepDecay", "step_size", step_size)
        if not gamma < 1.0:
            raise ConfigError(f"StepDecay: gamma must be < 1.0, got {gamma!r}")
        self.gamma = float(gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** (self.last_epoch // self.step_size)


class MultiStepDecay(LRScheduler):
    """lr = base_lr * gamma ** (number of milestones passed)."""

    def __init__(self, learning_rate: float, milestones: list[int], gamma: float = 0.1,
                 last_epoch: int = -1, verbose: bool = False) -> None:
        milestones = list(milestones)
        if any(b <= a for a, b in itertools.pairwise(milestones)):
            raise ConfigError(f"MultiStepDecay: milestones must increase, got {milestones}")
        if not gamma < 1.0:
            raise ConfigError(f"MultiStepDecay: gamma must be < 1.0, got {gamma!r}")
        self.milestones, self.gamma = milestones, float(gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        passed = sum(1 for m in self.milestones if self.last_epoch >= m)
        return self.base_lr * self.gamma ** passed


class ExponentialDecay(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, learning_rate: float, gamma: float, last_epoch: int = -1,
                 verbose: bool = False) -> None:
        if not 0.0 < gamma < 1.0:
            raise ConfigError(f"ExponentialDecay: gamma must be in (0, 1), got {gamma!r}")
        self.gamma = float(gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** self.last_epoch


class CosineAnnealingDecay(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2.

    Paddle computes the same curve recursively; the closed form avoids its drift."""

    def __init__(self, learning_rate: float, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1, verbose: bool = False) -> None:
        self.T_max = _check_positive_int("CosineAnnealingDecay", "T_max", T_max)
        self.eta_min = float(eta_min)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        cos = math.cos(math.pi * self.last_epoch / self.T_max)
        return self.eta_min + (self.base_lr - self.eta_min) * (1.0 + cos) / 2.0


class LinearWarmup(LRScheduler):
    """Linear from start_lr to end_lr over warmup_steps, then ``learning_rate`` (a number,
    or a scheduler that starts at its step 0 when the warm-up ends)."""

    def __init__(self, learning_rate: float | LRScheduler, warmup_steps: int,
                 start_lr: float, end_lr: float, last_epoch: int = -1,
                 verbose: bool = False) -> None:
        if not isinstance(learning_rate, (int, float, LRScheduler)):
            raise ConfigError("LinearWarmup: learning_rate must be a number or an "
                              f"LRScheduler, got {type(learning_rate).__name__}")
        self.learning_rate = learning_rate
        self.warmup_steps = _check_positive_int("LinearWarmup", "warmup_steps", warmup_steps)
        self.start_lr, self.end_lr = float(start_lr), float(end_lr)
        if end_lr <= start_lr:
            raise ConfigError(f"LinearWarmup: end_lr ({end_lr}) must be > start_lr ({start_lr})")
        super().__init__(start_lr, last_epoch, verbose)

    def get_lr(self) -> float:
        if self.last_epoch < self.warmup_steps:
            frac = self.last_epoch / self.warmup_steps
            return (self.end_lr - self.start_lr) * frac + self.start_lr
        if isinstance(self.learning_rate, LRScheduler):
            self.learning_rate.step(self.last_epoch - self.warmup_steps)
            return self.learning_rate()
        return float(self.learning_rate)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if isinstance(self.learning_rate, LRScheduler):
            state["LinearWarmup_LR"] = self.learning_rate.state_dict()
        return state

    def set_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().set_state_dict(state_dict)
        if isinstance(self.learning_rate, LRScheduler) and "LinearWarmup_LR" in state_dict:
            self.learning_rate.set_state_dict(state_dict["LinearWarmup_LR"])

    set_dict = set_state_dict
