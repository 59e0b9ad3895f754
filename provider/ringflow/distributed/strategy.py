"""``DistributedStrategy``: fleet's configuration with Paddle's names and merge semantics, for
the features ringflow knows: tensor_parallel, sharding, amp, recompute, lamb, lars, all-reduce
fusion."""

from __future__ import annotations

import copy
import numbers
from typing import Any

from ringflow.errors import ConfigError

# feature -> its ``<feature>_configs`` fields with their defaults (Paddle's proto defaults)
_FEATURES: dict[str, dict[str, Any]] = {
    "amp": {
        "init_loss_scaling": 32768.0, "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2,
        "incr_ratio": 2.0, "decr_ratio": 0.8, "use_dynamic_loss_scaling": True,
        "custom_white_list": [], "custom_black_list": [], "use_pure_fp16": False,
        "use_fp16_guard": True,
    },
    "recompute": {"checkpoints": [], "enable_offload": False},
    "lamb": {"lamb_weight_decay": 0.01, "exclude_from_weight_decay": []},
    "lars": {"lars_coeff": 0.001, "lars_weight_decay": 0.0005, "epsilon": 0.0,
             "exclude_from_weight_decay": []},
    "tensor_parallel": {"tensor_parallel_degree": 1, "tensor_init_seed": -1},
    # Paddle's ShardingConfig, its defaults; what ringflow does with each: sharding.py
    "sharding": {
        "sharding_segment_strategy": "segment_broadcast_MB", "segment_broadcast_MB": 32.0,
        "segment_anchors": [], "sharding_degree": 8, "mp_degree": 1, "dp_degree": 1,
        "hybrid_dp": False, "gradient_merge_acc_step": 1, "optimize_offload": False,
        "pp_allreduce_in_optimize": False, "pp_degree": 1, "optimize_cast": False,
        "_dp_as_optimizer_sharding": False, "stage": 1, "enable_tuning": False,
    },
}
_OPTIONS: dict[str, Any] = {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 32}

# Lower bounds where a smaller value has no meaning (Paddle checks none of them; a degree of 0
# would only surface later as a division by zero). tensor_init_seed -1 means "unset".
_MINIMUM = {"tensor_parallel_degree": 1, "tensor_init_seed": -1, "incr_every_n_steps": 1,
            "decr_every_n_nan_or_inf": 1, "fuse_grad_size_in_MB": 1, "sharding_degree": 1,
            "mp_degree": 1, "dp_degree": 1, "pp_degree": 1, "gradient_merge_acc_step": 1,
            "stage": 1}


def _checked(where: str, name: str, default: Any, value: Any) -> Any:
    """``value`` in the type of ``default`` (bool, int, float or list of names), or a
    ConfigError naming ``where`` and the value."""
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "a bool"
    elif isinstance(default, int):
        ok, kind = isinstance(value, numbers.Integral) and not isinstance(value, bool), "an int"
    elif isinstance(default, float):
        ok, kind = isinstance(value, numbers.Real) and not isinstance(value, bool), "a number"
    elif isinstance(default, str):
        ok, kind = isinstance(value, str), "a str"
    else:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        kind = "a list of str"
    if not ok:
        raise ConfigError(f"{where} must be {kind}, got {value!r} ({type(value).__name__})")
    minimum = _MINIMUM.get(name)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where} must be >= {minimum}, got {value!r}")
    if isinstance(default, list):
        return list(value)
    return type(default)(value)


def _checked_configs(feature: str, configs: Any) -> dict[str, Any]:
    """The checked values of a ``<feature>_configs`` assignment; nothing is assigned unless
    every key and value is valid."""
    attr, defaults = f"{feature}_configs", _FEATURES[feature]
    if not isinstance(configs, dict):
        raise ConfigError(f"{attr} must be a dict, got {configs!r} ({type(configs).__name__})")
    for key in configs:
        if key not in defaults:
            raise ConfigError(f"{attr}: unknown key {key!r}; known keys: {', '.join(defaults)}")
    return {key: _checked(f"{attr}[{key!r}]", key, defaults[key], value)
            for key, value in configs.items()}


def _feature(name: str, doc: str) -> property:
    def get(self: DistributedStrategy) -> bool:
        return self._flags[name]

    def set(self: DistributedStrategy, flag: Any) -> None:
        self._flags[name] = _checked(name, name, False, flag)
        self._non_auto_set = True

    return property(get, set, doc=doc)


def _configs(feature: str, doc: str) -> property:
    def get(self: DistributedStrategy) -> dict[str, Any]:
        return copy.deepcopy(self._configs[feature])

    def set(self: DistributedStrategy, configs: Any) -> None:
        # MERGE, as Paddle's assign_configs_value: keys not given keep their value.
        checked = _checked_configs(feature, configs)
        self._configs[feature].update(checked)
        self._given[feature].update(checked)
        self._non_auto_set = True

    return property(get, set, doc=doc)


def _option(name: str, doc: str) -> property:
    def get(self: DistributedStrategy) -> Any:
        return self._options[name]

    def set(self: DistributedStrategy, value: Any) -> None:
        self._options[name] = _checked(name, name, _OPTIONS[name], value)
        self._non_auto_set = True

    return property(get, set, doc=doc)


class DistributedStrategy:
    """What fleet should do to the user's program (``paddle.distributed.fleet.
    DistributedStrategy``). Feature flags are bools; a ``*_configs`` getter returns a new dict
    of ALL its fields and its setter merges: only the keys given change (``{}`` changes
    nothing), unknown keys and ill-typed values are ConfigErrors and change nothing.

    Lists in configs are replaced, not appended to as Paddle's protobuf ``extend`` does.
    Setting an attribute that is not an option is a ConfigError (Paddle: TypeError)."""

    auto = property(
        lambda self: self._auto, lambda self, flag: self._set_auto(flag),
        doc="Let fleet turn on every meta-optimizer that can apply; only 'strictly' auto "
            "(no other option set) has an effect. Default False.")
    amp = _feature("amp", "Automatic mixed precision. Default False.")
    amp_configs = _configs(
        "amp", "init_loss_scaling 32768.0, incr_every_n_steps 1000, decr_every_n_nan_or_inf 2, "
               "incr_ratio 2.0, decr_ratio 0.8, use_dynamic_loss_scaling True, "
               "custom_white_list [], custom_black_list [], use_pure_fp16 False, "
               "use_fp16_guard True.")
    recompute = _feature("recompute", "Recompute activations in backward. Default False.")
    recompute_configs = _configs(
        "recompute", "checkpoints [] (variable names), enable_offload False.")
    lamb = _feature("lamb", "Replace the optimizer by LAMB. Default False.")
    lamb_configs = _configs("lamb", "lamb_weight_decay 0.01, exclude_from_weight_decay [].")
    lars = _feature("lars", "Replace the momentum optimizer by LARS. Default False.")
    lars_configs = _configs(
        "lars", "lars_coeff 0.001, lars_weight_decay 0.0005, epsilon 0.0, "
                "exclude_from_weight_decay [].")
    tensor_parallel = _feature(
        "tensor_parallel", "Split layers over tensor_parallel_degree ranks (static-graph "
                           "TensorParallelOptimizer). Default False.")
    tensor_parallel_configs = _configs(
        "tensor_parallel", "tensor_parallel_degree 1 (int >= 1: ranks of one mp group), "
                           "tensor_init_seed -1 (parameter seed; the static TP optimizer "
                           "ignores it, as Paddle's does).")
    sharding = _feature(
        "sharding", "Shard the optimizer state (stage 1) and the gradients (stage 2) over the "
                    "data-parallel ranks (ShardingOptimizer). Default False.")
    sharding_configs = _configs(
        "sharding", "sharding_degree (ranks sharing one model's state; ringflow: the "
                    "data-parallel degree unless given; Paddle's default 8), stage 1 (1 or 2), "
                    "mp_degree 1 (tensor parallelism inside, Paddle's hybrid form), "
                    "dp_degree 1, pp_degree 1, and Paddle's other ShardingConfig fields "
                    "(accepted; see ringflow.distributed.meta_optimizers.sharding).")
    fuse_all_reduce_ops = _option(
        "fuse_all_reduce_ops", "Fuse gradient all-reduces into buckets. Default True.")
    fuse_grad_size_in_MB = _option(
        "fuse_grad_size_in_MB", "Bucket size for fuse_all_reduce_ops (int MB). Default 32.")

    def __init__(self) -> None:
        # Straight into __dict__: __setattr__ only lets options be assigned.
        self.__dict__.update(
            _auto=False,
            _non_auto_set=False,  # per instance; Paddle keeps one module-global flag
            _flags={name: False for name in _FEATURES},
            _configs=copy.deepcopy(_FEATURES),
            _given={name: set() for name in _FEATURES},  # config keys ever assigned
            _options=dict(_OPTIONS),
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if not hasattr(type(self), name) and name not in self.__dict__:
            raise ConfigError(f"DistributedStrategy has no option {name!r}; options: "
                              f"{', '.join(_option_names())}")
        object.__setattr__(self, name, value)

    def _set_auto(self, flag: Any) -> None:
        self._auto = _checked("auto", "auto", False, flag)

    def _was_given(self, feature: str, key: str) -> bool:
        """Whether ``<feature>_configs[key]`` was ever assigned (a default that ringflow
        derives, such as the sharding degree, applies only while it was not)."""
        return key in self._given[feature]

    def _mp_degree(self) -> int | None:
        """The tensor-parallel degree the strategy asks for (``tensor_parallel``, or
        Paddle's hybrid form ``sharding_configs["mp_degree"]``), None when it asks none."""
        if self.tensor_parallel:
            return int(self._configs["tensor_parallel"]["tensor_parallel_degree"])
        if self.sharding and self._was_given("sharding", "mp_degree"):
            return int(self._configs["sharding"]["mp_degree"])
        return None

    def _is_strict_auto(self) -> bool:
        """True when ``auto`` is on and no other option was ever set (Paddle's rule)."""
        return self._auto and not self._non_auto_set

    def _settings(self) -> list[str]:
        """One ``name = value`` per option that differs from its default; an enabled
        feature shows all its configs, a disabled one the config fields that differ."""
        lines = ["auto = True"] if self._auto else []
        for feature, defaults in _FEATURES.items():
            configs = self._configs[feature]
            if self._flags[feature]:
                lines += [f"{feature} = True", f"{feature}_configs = {configs!r}"]
            else:
                lines += [f"{feature}_configs.{key} = {value!r}"
                          for key, value in configs.items() if value != defaults[key]]
        lines += [f"{name} = {value!r}" for name, value in self._options.items()
                  if value != _OPTIONS[name]]
        return lines

    def __str__(self) -> str:
        settings = self._settings()
        if not settings:
            return "DistributedStrategy: all defaults"
        return "\n  ".join(["DistributedStrategy:", *settings])

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DistributedStrategy):
            return NotImplemented
        return self._state() == other._state()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def _state(self) -> tuple:
        return self._auto, self._flags, self._configs, self._options


def _option_names() -> list[str]:
    return ["auto", *[n for f in _FEATURES for n in (f, f"{f}_configs")], *_OPTIONS]
