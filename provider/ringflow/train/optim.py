"""The optimizer, learning-rate schedule and gradient clip of a job spec: their JSON
arguments checked against the constructors (unknown names and wrong types named), then the
ringflow objects built from them. The spec validates with these builders, and the worker
trains with what they return, so a spec that validates is a spec that builds."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError, did_you_mean


@functools.cache
def optimizer_classes() -> dict[str, str]:
    """Spec name -> class name in ringflow.optimizer, from the update rules (read when a
    spec is first checked: loading the op table costs ~0.4 s an import need not pay)."""
    from ..ops.update_rules import by_spec_name

    return {name: rule.optimizer for name, rule in by_spec_name().items()}


def __getattr__(name: str) -> Any:
    if name == "OPTIMIZER_CLASSES":
        return optimizer_classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
#: the smallest learning rate an optimizer takes
LEARNING_RATE_MINIMUM = 0.0
#: constructor arguments a JSON spec cannot set, and why
NOT_FROM_SPEC = {
    "parameters": "every trainable parameter is optimized",
    "parameter_list": "every trainable parameter is optimized",
    "grad_clip": "use the spec's grad_clip field",
    "name": "it has no effect on training",
    "regularization": "use weight_decay",
    "lr_ratio": "it takes a Python callable",
    "apply_decay_param_fun": "it takes a Python callable",
    "exclude_from_weight_decay_fn": "it takes a Python callable",
}
#: schedule type -> {argument: default}; None = required; "learning_rate" means the
#: optimizer's learning rate, "steps" the job's target
LR_SCHEDULE_ARGS: dict[str, dict[str, Any]] = {
    "cosine": {"T_max": "steps", "eta_min": 0.0},
    "step": {"step_size": None, "gamma": 0.1},
    "linear_warmup": {"warmup_steps": None, "start_lr": 0.0, "end_lr": "learning_rate",
                      "after": None},
}
_INT_ARGS = {"T_max", "step_size", "warmup_steps"}


def _optimizer_class(kind: str) -> type:
    from .. import optimizer

    return getattr(optimizer, optimizer_classes()[kind])


def optimizer_arguments(kind: str) -> dict[str, inspect.Parameter]:
    """The arguments a spec may give optimizer ``kind``: its constructor's, less
    ``NOT_FROM_SPEC``."""
    params = inspect.signature(_optimizer_class(kind)).parameters
    return {n: p for n, p in params.items() if n not in NOT_FROM_SPEC}


def check_optimizer(value: Any) -> dict[str, Any]:
    """The spec's ``optimizer`` dict, checked: ``type`` known, every other key an argument
    of that optimizer with a value of the right type, no required argument missing."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"optimizer must be an object with a 'type' and that optimizer's "
                          f"arguments, got {value!r}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in optimizer_classes():
        raise ConfigError(f"optimizer.type must be one of {', '.join(optimizer_classes())}, "
                          f"got {kind!r}")
    allowed = optimizer_arguments(kind)
    for name, arg in value.items():
        if name == "type":
            continue
        if name in NOT_FROM_SPEC:
            raise ConfigError(f"optimizer.{name} cannot be set in a job spec: "
                              f"{NOT_FROM_SPEC[name]}")
        if name not in allowed:
            raise ConfigError(f"optimizer: unknown argument {name!r} for {kind}"
                              f"{did_you_mean(name, list(allowed))} (it takes "
                              f"{', '.join(sorted(allowed))})")
        _check_argument(f"optimizer.{name}", arg, allowed[name])
    missing = [n for n, p in allowed.items()
               if p.default is inspect.Parameter.empty and n not in value]
    if missing:
        raise ConfigError(f"optimizer: {kind} needs {', '.join(missing)}")
    return dict(value)


def _check_argument(where: str, value: Any, param: inspect.Parameter) -> None:
    default = param.default
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
    elif param.name == "exclude_from_weight_decay":
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where} must be a list of parameter-name parts, got {value!r}")
    elif value is not None or default is not None:
        check_number(where, value, LEARNING_RATE_MINIMUM if param.name == "learning_rate"
                     else None)


def check_number(where: str, value: Any, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where} must be >= {minimum}, got {value!r}")
    return float(value)


def check_lr_schedule(value: Any, nested: bool = False) -> dict[str, Any] | None:
    """The spec's ``lr_schedule``: null, or ``{"type": cosine|step|linear_warmup, ...}``
    with that schedule's arguments (``LR_SCHEDULE_ARGS``); linear_warmup may name the
    schedule that follows the warm-up in ``after`` (cosine or step)."""
    where = "lr_schedule.after" if nested else "lr_schedule"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be null or an object with a 'type', got {value!r}")
    kinds = ("cosine", "step") if nested else tuple(LR_SCHEDULE_ARGS)
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in kinds:
        raise ConfigError(f"{where}.type must be one of {', '.join(kinds)}, got {kind!r}")
    args = LR_SCHEDULE_ARGS[kind]
    for name, arg in value.items():
        if name == "type":
            continue
        if name not in args:
            raise ConfigError(f"{where}: unknown argument {name!r} for {kind}"
                              f"{did_you_mean(name, list(args))} (it takes {', '.join(args)})")
        if name == "after":
            check_lr_schedule(arg, nested=True)
        elif name in _INT_ARGS:
            if isinstance(arg, bool) or not isinstance(arg, int) or arg < 1:
                raise ConfigError(f"{where}.{name} must be an integer >= 1, got {arg!r}")
        else:
            check_number(f"{where}.{name}", arg)
    missing = [n for n, d in args.items() if d is None and n != "after" and n not in value]
    if missing:
        raise ConfigError(f"{where}: {kind} needs {', '.join(missing)}")
    return dict(value)


def build_optimizer(optimizer: Mapping[str, Any], lr_schedule: Mapping[str, Any] | None,
                    grad_clip: float | None, steps: int):
    """The ringflow optimizer of a (checked) spec, with its schedule and clip. A value the
    constructors refuse (Adam's beta1 of 1.5) is a ConfigError naming the field."""
    from ..optimizer import ClipGradByGlobalNorm

    kwargs = {k: v for k, v in optimizer.items() if k != "type"}
    lr = float(kwargs.pop("learning_rate", optimizer_arguments(optimizer["type"])[
        "learning_rate"].default))
    schedule = _guarded("lr_schedule", build_lr_schedule, lr_schedule, lr, steps)
    clip = None if grad_clip is None else _guarded("grad_clip", ClipGradByGlobalNorm,
                                                     grad_clip)
    cls = _optimizer_class(optimizer["type"])
    return _guarded("optimizer", cls, learning_rate=lr if schedule is None else schedule,
                    grad_clip=clip, **kwargs)


def build_lr_schedule(spec: Mapping[str, Any] | None, lr: float, steps: int,
                      offset: int = 0):
    """The scheduler of ``spec`` starting from the optimizer's rate ``lr`` (None for
    none). ``offset``: steps taken by a warm-up before this schedule starts."""
    from ..optimizer import lr as schedules

    if spec is None:
        return None
    args = {k: v for k, v in spec.items() if k not in ("type", "after")}
    if spec["type"] == "cosine":
        args.setdefault("T_max", max(1, steps - offset))
        return schedules.CosineAnnealingDecay(lr, **args)
    if spec["type"] == "step":
        return schedules.StepDecay(lr, **args)
    args.setdefault("start_lr", 0.0)
    args.setdefault("end_lr", lr)
    after = build_lr_schedule(spec.get("after"), lr, steps, offset + args["warmup_steps"])
    return schedules.LinearWarmup(lr if after is None else after, **args)


def _guarded(field: str, build: Callable, *args: Any, **kwargs: Any) -> Any:
    try:
        return build(*args, **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None
