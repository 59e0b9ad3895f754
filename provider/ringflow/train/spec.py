"""The training job spec (issue 8): one frozen dataclass, validated here without pydantic
(this runs on training hosts). The Airflow provider wraps it in a pydantic model built from
``dataclasses.fields(JobSpec)`` (real types, not strings: this module does not use
``from __future__ import annotations``), ``FIELD_DOCS`` and ``FIELD_MINIMUMS``, and can
call ``JobSpec.from_dict`` for the very same errors."""

import dataclasses
import inspect
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ConfigError, did_you_mean
from . import optim

BUILTIN_MODELS = ("mlp", "transformer")
TOKENIZERS = ("byte", "char")
DTYPES = ("float32", "float64")
# package.module:build_fn
_BUILDER_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*\Z")
# built-in model arguments that must split evenly across the model-parallel ranks
_SPLIT_BY_DEGREE = {"mlp": ("hidden_size",), "transformer": ("num_heads", "vocab_size",
                                                             "ffn_size")}

FIELD_DOCS: dict[str, str] = {
    "model": "mlp, transformer, or package.module:build_fn (called as build_fn(mp_degree=..., "
             "dtype=..., **model_args), returning a ringflow.models.BuiltModel)",
    "model_args": "arguments passed to the model builder (sizes, layers, heads, dropout)",
    "data": "synthetic (the model's seeded batches); the path of an .npz file whose arrays "
            "are named as the model's feeds (one row per sample) or of a .csv of features "
            "and a last column of integer labels (the mlp); or, for the transformer, a UTF-8 "
            "text file, a folder of them (one token stream), or an .npy token stream "
            "(memory-mapped). Paths are read on each host",
    "tokenizer": "how text data becomes tokens: byte (the UTF-8 bytes, vocabulary 256) or "
                 "char (the corpus's characters, a vocabulary stored with the checkpoint)",
    "validation_fraction": "hold out this fraction of the data for validation (text: its "
                           "tail; rows: chosen by the seed); 0: none",
    "eval_data": "validation data of the same kinds as data (null: none, or "
                 "validation_fraction)",
    "eval_every": "compute the validation loss every this many steps (and at the last)",
    "optimizer": "{'type': sgd|momentum|adam|adamw|lamb|lars, ...that optimizer's "
                 "arguments (learning_rate, beta1, momentum, weight_decay, ...)}",
    "lr_schedule": "null, or {'type': cosine (T_max = steps, eta_min) | step (step_size, "
                   "gamma) | linear_warmup (warmup_steps, start_lr, end_lr, after)}",
    "grad_clip": "clip gradients to this global norm (null: no clipping)",
    "steps": "the total number of training steps, counted across resumes",
    "global_batch_size": "samples per step over all data-parallel ranks; divisible by the "
                         "data-parallel degree (world size / tensor_parallel_degree)",
    "seed": "seeds the parameters, the data order and dropout",
    "tensor_parallel_degree": "ranks that split each layer; divides the ranks per host",
    "dtype": "float32 or float64 (parameters and activations)",
    "log_every": "print a metric line every this many steps (and at step 1 and the last)",
    "checkpoint_dir": "directory of the checkpoints (null: none are written)",
    "checkpoint_every": "write a checkpoint every this many steps (and at the last step)",
    "resume": "resume from the newest complete checkpoint in checkpoint_dir if there is one",
    "amp": "automatic mixed precision: float16 matmuls with float32 master weights and "
           "dynamic loss scaling (fleet's AMPOptimizer); float32 models only",
    "recompute": "recompute activations in the backward pass instead of keeping them: true "
                 "for the model's natural checkpoints (each block's output), or a list of "
                 "checkpoint variable names (fleet's RecomputeOptimizer)",
    "sharding_stage": "0: off; 1: each data-parallel rank holds and updates the optimizer "
                      "state of its share of the parameters; 2: and keeps only its share "
                      "of the reduced gradients (fleet's sharding, ZeRO stages 1 and 2)",
    "gradient_accumulation_steps": "micro-steps per step: each rank runs the step's batch in "
                                   "this many parts and the optimizer applies their mean "
                                   "gradient once (fleet's gradient_merge); 1: off. The "
                                   "global batch must divide by it x the data-parallel "
                                   "degree; not with amp or sharding",
}
#: the smallest value each integer field takes (JSON-schema ``minimum``)
FIELD_MINIMUMS: dict[str, int] = {"steps": 1, "global_batch_size": 1, "seed": 0,
                                  "tensor_parallel_degree": 1, "log_every": 1,
                                  "checkpoint_every": 1, "sharding_stage": 0, "eval_every": 1,
                                  "gradient_accumulation_steps": 1}
#: the largest value of the integer fields that have one (JSON-schema ``maximum``)
FIELD_MAXIMUMS: dict[str, int] = {"sharding_stage": 2}


def _default_optimizer() -> dict[str, Any]:
    return {"type": "adam", "learning_rate": 1e-3}


@dataclass(frozen=True)
class JobSpec:
    """What one training job does; see ``FIELD_DOCS``. Construction validates (a bad value
    is a ConfigError naming the field and the value); ``from_dict`` also refuses unknown
    fields."""

    model: str = "transformer"
    model_args: dict[str, Any] = field(default_factory=dict)
    data: str = "synthetic"
    tokenizer: Literal["byte", "char"] = "byte"
    validation_fraction: float = 0.0
    eval_data: str | None = None
    eval_every: int = 100
    optimizer: dict[str, Any] = field(default_factory=_default_optimizer)
    lr_schedule: dict[str, Any] | None = None
    grad_clip: float | None = None
    steps: int = 200
    global_batch_size: int = 32
    seed: int = 0
    tensor_parallel_degree: int = 1
    dtype: Literal["float32", "float64"] = "float32"
    log_every: int = 10
    checkpoint_dir: str | None = None
    checkpoint_every: int = 100
    resume: bool = True
    amp: bool = False
    recompute: bool | list[str] = False
    sharding_stage: int = 0
    gradient_accumulation_steps: int = 1

    def __post_init__(self) -> None:
        for name, minimum in FIELD_MINIMUMS.items():
            _check_int(name, getattr(self, name), minimum, FIELD_MAXIMUMS.get(name))
        _check_model(self.model)
        self._check_data()
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be float32 or float64, got {self.dtype!r}")
        for name in ("resume", "amp"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.amp and self.dtype != "float32":
            raise ConfigError(f"amp trains float32 models (float16 compute, float32 master "
                              f"weights); dtype is {self.dtype}")
        if self.gradient_accumulation_steps > 1 and (self.amp or self.sharding_stage):
            raise ConfigError(f"gradient_accumulation_steps {self.gradient_accumulation_steps}"
                              f" does not combine with {'amp' if self.amp else 'sharding'}")
        object.__setattr__(self, "recompute", _check_recompute(self.recompute))
        if self.checkpoint_dir is not None:
            _check_path("checkpoint_dir", self.checkpoint_dir)
        if self.grad_clip is not None:
            clip = optim.check_number("grad_clip", self.grad_clip)
            if clip <= 0:
                raise ConfigError(f"grad_clip must be a number > 0 or null, got "
                                  f"{self.grad_clip!r}")
            object.__setattr__(self, "grad_clip", clip)
        object.__setattr__(self, "model_args", _check_model_args(self.model, self.model_args))
        object.__setattr__(self, "optimizer", optim.check_optimizer(self.optimizer))
        object.__setattr__(self, "lr_schedule", optim.check_lr_schedule(self.lr_schedule))
        for name in ("model_args", "optimizer", "lr_schedule"):
            _check_json(name, getattr(self, name))
        self.build_optimizer()  # the constructors' own range checks (Adam's beta1 < 1, ...)

    def _check_data(self) -> None:
        _check_path("data", self.data)
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"tokenizer must be byte or char, got {self.tokenizer!r}")
        fraction = optim.check_number("validation_fraction", self.validation_fraction, 0.0)
        if fraction >= 1.0:
            raise ConfigError(f"validation_fraction must be in [0, 1), got "
                              f"{self.validation_fraction!r}")
        object.__setattr__(self, "validation_fraction", fraction)
        if self.eval_data is not None:
            _check_path("eval_data", self.eval_data)
            if self.eval_data == "synthetic":
                raise ConfigError("eval_data must be the path of a file or folder, got "
                                  "'synthetic'")
            if fraction:
                raise ConfigError("give validation_fraction or eval_data, not both")
        if fraction and self.data == "synthetic":
            raise ConfigError("validation_fraction holds out part of a data file; synthetic "
                              "data has none: give eval_data")

    # construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> "JobSpec":
        """A spec from JSON-like data; missing fields take their defaults."""
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"a job spec must be a JSON object, got {type(mapping).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        for key in mapping:
            if key not in known:
                hint = did_you_mean(key, known)
                raise ConfigError(f"unknown field {key!r} in the job spec{hint} (fields: "
                                  f"{', '.join(known)})")
        return cls(**mapping)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "JobSpec":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(f"cannot read the job spec {os.fspath(path)!r}: "
                              f"{exc.strerror}") from None
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"job spec {os.fspath(path)!r} is not valid JSON: {exc}") from None
        return cls.from_dict(mapping)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; ``JobSpec.from_dict(spec.to_dict()) == spec``."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    # checks that need the job's layout ------------------------------------------------------
    def dp_degree(self, world_size: int) -> int:
        return world_size // self.tensor_parallel_degree

    def check_layout(self, world_size: int, nproc_per_host: int) -> None:
        """The degree must divide the ranks per host (an mp group stays inside a host), the
        global batch must split evenly over the data-parallel ranks, and the built-in
        model's split sizes must split evenly over the model-parallel ranks."""
        degree = self.tensor_parallel_degree
        if nproc_per_host < 1 or world_size % nproc_per_host:
            raise ConfigError(f"world size {world_size} is not a multiple of the ranks per "
                              f"host {nproc_per_host}")
        if nproc_per_host % degree:
            raise ConfigError(f"tensor_parallel_degree {degree} does not divide the ranks "
                              f"per host {nproc_per_host} (model-parallel groups stay inside "
                              f"a host)")
        dp = self.dp_degree(world_size)
        if self.global_batch_size % dp:
            raise ConfigError(f"global_batch_size {self.global_batch_size} is not divisible "
                              f"by the data-parallel degree {dp} (world size {world_size} / "
                              f"tensor_parallel_degree {degree})")
        micro = self.gradient_accumulation_steps
        if self.global_batch_size % (dp * micro):
            raise ConfigError(f"global_batch_size {self.global_batch_size} is not divisible "
                              f"by gradient_accumulation_steps {micro} x the data-parallel "
                              f"degree {dp}")
        for name, size in _split_sizes(self.model, self.model_args).items():
            if size % degree:
                raise ConfigError(f"model_args.{name} {size} is not divisible by "
                                  f"tensor_parallel_degree {degree}")

    def build_optimizer(self):
        """A new ringflow optimizer with this spec's schedule and clip."""
        return optim.build_optimizer(self.optimizer, self.lr_schedule, self.grad_clip,
                                     self.steps)


def _check_recompute(value: Any) -> bool | list[str]:
    """true, false, or a non-empty list of checkpoint variable names (a list copy)."""
    if isinstance(value, bool):
        return value
    if (isinstance(value, (list, tuple)) and value
            and all(isinstance(n, str) and n.strip() for n in value)):
        return list(value)
    raise ConfigError(f"recompute must be true, false or a non-empty list of checkpoint "
                      f"variable names, got {value!r}")


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
            or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ConfigError(f"{name} must be an integer {bound}, got {value!r}")


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


def _check_path(name: str, value: Any) -> None:
    """A non-empty string the OS can take as a path (no NUL)."""
    _check_str(name, value)
    if "\0" in value:
        raise ConfigError(f"{name} must be a path, got {value!r} (it holds a NUL)")


def _check_model(model: Any) -> None:
    if not isinstance(model, str) or not (model in BUILTIN_MODELS or _BUILDER_RE.match(model)):
        raise ConfigError(f"model must be mlp, transformer or package.module:build_fn, "
                          f"got {model!r}")


def _builder_params(model: str) -> dict[str, inspect.Parameter]:
    from .. import models

    params = inspect.signature(getattr(models, model)).parameters
    return {n: p for n, p in params.items() if n not in ("mp_degree", "dtype")}


def _check_model_args(model: str, args: Any) -> dict[str, Any]:
    """A dict with string keys; for a built-in model, its builder's arguments with values
    of the builder's types (sizes integers >= 1, dropout in [0, 1))."""
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        raise ConfigError(f"model_args must be an object of builder arguments, got {args!r}")
    for key in ("mp_degree", "dtype"):
        if key in args:
            source = "tensor_parallel_degree" if key == "mp_degree" else "dtype"
            raise ConfigError(f"model_args.{key} cannot be set: the spec's {source} sets it")
    if model not in BUILTIN_MODELS:
        return dict(args)
    params = _builder_params(model)
    for key, value in args.items():
        if key not in params:
            raise ConfigError(f"model_args: unknown argument {key!r} for {model}"
                              f"{did_you_mean(key, list(params))} (it takes "
                              f"{', '.join(params)})")
        _check_builder_value(f"model_args.{key}", value, params[key].default)
    return dict(args)


def _check_builder_value(where: str, value: Any, default: Any) -> None:
    if isinstance(default, float):
        if optim.check_number(where, value, 0.0) >= 1.0:
            raise ConfigError(f"{where} must be in [0, 1), got {value!r}")
    elif isinstance(default, str):
        _check_str(where, value)
    elif value is not None or default is not None:
        _check_int(where, value, 1)


def _split_sizes(model: str, args: Mapping[str, Any]) -> dict[str, int]:
    if model not in BUILTIN_MODELS:
        return {}
    params = _builder_params(model)
    sizes = {n: args.get(n, params[n].default) for n in _SPLIT_BY_DEGREE[model]}
    if model == "transformer" and sizes["ffn_size"] is None:
        sizes["ffn_size"] = 4 * args.get("hidden_size", params["hidden_size"].default)
    return sizes


def _check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must hold JSON values only: {exc}") from None

