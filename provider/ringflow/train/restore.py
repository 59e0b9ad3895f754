"""A checkpoint of any layout loaded into one process: the job's model built serially (its
spec from the checkpoint, tensor_parallel_degree 1), each tensor-parallel parameter put
together from the shards of model-parallel ranks 0..mp-1 (their slices, concatenated along
the axis on which a slice is shorter than the whole), for evaluation and generation."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from .checkpoint import (
    Checkpoint,
    host_complete_steps,
    latest_checkpoint,
    read_complete,
    read_host_complete,
    read_meta,
)
from .spec import JobSpec
from .text import Tokenizer

_STEP_DIR = "step-"


@dataclass
class Restored:
    """The serial model of a checkpoint: its spec (as trained), the forward program (a
    ``clone(for_test=True)``), the BuiltModel, a scope holding the parameters, the
    checkpoint and its meta, and the tokenizer of its text (None without one)."""

    spec: JobSpec
    program: Any
    model: Any
    scope: Any
    checkpoint: Checkpoint
    meta: dict[str, Any]
    tokenizer: Tokenizer | None

    @property
    def params(self) -> dict[str, np.ndarray]:
        return {p.name: np.asarray(self.scope[p.name])
                for p in self.program.global_block().iter_parameters()}


def find_checkpoint(path: str) -> Checkpoint:
    """``path`` is a step folder (``.../step-00000200``), or a checkpoint_dir: its newest
    complete checkpoint. On the first host of a job whose hosts do not share a disk, the
    first host's part is enough (it holds the shards of model-parallel ranks 0..mp-1)."""
    path = os.path.abspath(path)
    name = os.path.basename(path)
    if name.startswith(_STEP_DIR) and name[len(_STEP_DIR):].isdigit():
        root, step = os.path.dirname(path), int(name[len(_STEP_DIR):])
        found = read_complete(root, step) or read_host_complete(root, step, 0)
        if found is None:
            raise ConfigError(f"checkpoint {path}: not a complete checkpoint folder (every "
                              f"host's manifest and the shards they list)")
        return found
    if not os.path.isdir(path):
        raise ConfigError(f"checkpoint {path}: no such folder")
    found = latest_checkpoint(path) or next(reversed(host_complete_steps(path, 0)), None)
    if found is None:
        raise ConfigError(f"checkpoint {path}: the folder holds no complete checkpoint")
    return found


def serial_spec(meta: dict[str, Any], where: str) -> JobSpec:
    """The spec of the job that wrote a checkpoint, as one process trains it."""
    if not isinstance(meta.get("spec"), dict):
        raise ConfigError(f"checkpoint {where} holds no job spec (written by an older "
                          f"ringflow): it cannot be loaded on its own")
    spec = JobSpec.from_dict(meta["spec"])
    return replace(spec, tensor_parallel_degree=1, sharding_stage=0, amp=False,
                   recompute=False, checkpoint_dir=None, resume=False)


def load(path: str) -> Restored:
    """The checkpoint at ``path`` (see ``find_checkpoint``) in this process."""
    from ..executor import Scope
    from ..framework.program import Program, program_guard
    from .build import build_model

    checkpoint = find_checkpoint(path)
    meta = read_meta(checkpoint.shard(0))
    spec = serial_spec(meta, checkpoint.path)
    main, startup = Program(), Program()
    main.random_seed = startup.random_seed = spec.seed
    with program_guard(main, startup):
        model = build_model(spec)
    program = main.clone(for_test=True)
    scope = Scope()
    for name, value in assemble(checkpoint, program).items():
        scope[name] = value
    tok = meta.get("tokenizer")
    return Restored(spec, program, model, scope, checkpoint, meta,
                    None if tok is None else Tokenizer.from_dict(tok))


def assemble(checkpoint: Checkpoint, program) -> dict[str, np.ndarray]:
    """Every parameter of the serial ``program``, whole, from the checkpoint's shards."""
    shards = []
    try:
        for rank in range(checkpoint.mp_degree):
            with np.load(checkpoint.shard(rank), allow_pickle=False) as npz:
                shards.append({n: npz[n] for n in npz.files})
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"checkpoint {checkpoint.path}: unreadable shard: {exc}") from None
    whole = {}
    for param in program.global_block().iter_parameters():
        parts = [s.get(param.name) for s in shards]
        if any(p is None for p in parts):
            raise ConfigError(f"checkpoint {checkpoint.path} has no parameter {param.name!r} "
                              f"in every model-parallel shard: it is not this model's")
        whole[param.name] = _join(param.name, list(param.shape), parts, checkpoint.path)
    return whole


def _join(name: str, shape: list[int], parts: list[np.ndarray], where: str) -> np.ndarray:
    piece = list(parts[0].shape)
    if piece == shape:
        return parts[0]
    differ = [a for a, (p, s) in enumerate(zip(piece, shape)) if p != s]
    if len(piece) != len(shape) or len(differ) != 1 or \
            piece[differ[0]] * len(parts) != shape[differ[0]]:
        raise ConfigError(f"checkpoint {where}: parameter {name!r} is stored as {piece} in "
                          f"{len(parts)} model-parallel shard(s); the model's is {shape}")
    return np.concatenate(parts, axis=differ[0])
