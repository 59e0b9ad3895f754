"""Building one rank's job from a JobSpec: who it is (the layout), fleet's strategy, the model
(built in or `package.module:build_fn`), the programs with fleet's meta-optimizers applied,
its data and its validation. `worker` trains what this builds.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from ..distributed.collective.registry import get_ring
from ..errors import ConfigError
from .checkpoint import Layout
from .data import Sources, local_rows, open_data
from .evaluation import Evaluator
from .spec import BUILTIN_MODELS, JobSpec

# (global ring, data-parallel ring) of TensorParallelOptimizer and of ShardingOptimizer (mp: 0)
_RINGS = {False: (1, 2), True: (3, 1)}


@dataclass
class Job:
    """What one rank trains with."""

    spec: JobSpec
    layout: Layout
    main: Any
    startup: Any
    model: Any  # ringflow.models.BuiltModel
    optimizer: Any
    data: Sources
    rows: tuple[slice, ...]   # per micro-step (gradient accumulation), in order
    rings: tuple[int, int] = (1, 2)   # (global, data-parallel) ring ids of its strategy
    evaluator: Evaluator | None = None


def read_layout(spec: JobSpec) -> Layout:
    """Who this rank is (fleet reads the env contract; without it, a world of one) and
    whether the spec fits: a ConfigError otherwise."""
    from ..distributed import fleet
    from ..distributed.env import int_var

    fleet.init(is_collective=True, strategy=job_strategy(spec))
    world, rank = fleet.worker_num(), fleet.worker_index()
    local_size = int_var(os.environ, "PADDLE_LOCAL_SIZE", 1, default=world)
    spec.check_layout(world, local_size)
    nnodes = int_var(os.environ, "PADDLE_NNODES", 1, default=world // local_size)
    if nnodes * local_size != world:
        raise ConfigError(f"PADDLE_NNODES={nnodes} hosts of PADDLE_LOCAL_SIZE={local_size} "
                          f"ranks do not make the world size {world}")
    return Layout(rank, world, spec.tensor_parallel_degree, local_size)


def applied_rings() -> tuple[int, int]:
    """(global ring id, data-parallel ring id) of the meta-optimizers fleet applied (a
    sharding job of one rank has no sharding rings)."""
    from ..distributed import fleet

    return _RINGS["ShardingOptimizer" in fleet._get_applied_meta_list()]


def job_strategy(spec: JobSpec, checkpoints: list[str] | None = None):
    """Fleet's strategy for the spec: tensor parallelism (with degree 1: plain data
    parallelism), sharding of ``sharding_stage`` over the data-parallel ranks, AMP, and
    Recompute once the model's ``checkpoints`` are known."""
    from ..distributed.strategy import DistributedStrategy

    strategy = DistributedStrategy()
    strategy.tensor_parallel = True
    strategy.tensor_parallel_configs = {"tensor_parallel_degree": spec.tensor_parallel_degree}
    if spec.sharding_stage:
        strategy.sharding = True
        strategy.sharding_configs = {"stage": spec.sharding_stage}
    strategy.amp = spec.amp
    if spec.gradient_accumulation_steps > 1:
        strategy.gradient_merge = True
        strategy.gradient_merge_configs = {"k_steps": spec.gradient_accumulation_steps,
                                           "avg": True}
    if spec.recompute and checkpoints is not None:
        strategy.recompute = True
        strategy.recompute_configs = {"checkpoints": list(checkpoints)}
    return strategy


def recompute_checkpoints(spec: JobSpec, model) -> list[str] | None:
    """The checkpoints of ``spec.recompute``: its list, or (true) the model's own; None
    without recompute. A model that names none is a ConfigError."""
    if not spec.recompute:
        return None
    if spec.recompute is not True:
        return list(spec.recompute)
    names = list(getattr(model, "checkpoints", None) or [])
    if not names:
        raise ConfigError(f"recompute is true but model {spec.model} names no checkpoints "
                          f"(BuiltModel.checkpoints): give recompute a list of variable names")
    return names


def build_model(spec: JobSpec):
    """The BuiltModel of the spec, built into the default programs."""
    if spec.model in BUILTIN_MODELS:
        from .. import models

        builder = getattr(models, spec.model)
    else:
        builder = _import_builder(spec.model)
    try:
        model = builder(mp_degree=spec.tensor_parallel_degree, dtype=spec.dtype,
                        **spec.model_args)
    except TypeError as exc:
        raise ConfigError(f"model {spec.model}: {exc}") from None
    if not all(hasattr(model, a) for a in ("loss", "feeds", "make_batch")):
        raise ConfigError(f"model {spec.model} returned {type(model).__name__}, not a "
                          f"ringflow.models.BuiltModel (loss, feeds, make_batch)")
    return model


def _import_builder(target: str):
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"model {target}: cannot import {module_name}: {exc}") from None
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ConfigError(f"model {target}: {module_name} has no function {attr!r}")
    return builder


def build_programs(spec: JobSpec):
    """(main, startup, model, optimizer) of this rank: the model built and fleet's
    meta-optimizers applied, with the role fleet was given (``read_layout``)."""
    from ..distributed import fleet
    from ..framework.program import Program, program_guard

    main, startup = Program(), Program()
    main.random_seed = startup.random_seed = spec.seed
    with program_guard(main, startup):
        model = build_model(spec)
        optimizer = spec.build_optimizer()
        checkpoints = recompute_checkpoints(spec, model)
        if checkpoints is not None:
            # the checkpoints are named by the model just built: the strategy is complete now
            role = fleet._role_maker()
            fleet.init(role, is_collective=True, strategy=job_strategy(spec, checkpoints))
        fleet.distributed_optimizer(optimizer).minimize(model.loss)
    return main, startup, model, optimizer


def build_job(spec: JobSpec, layout: Layout) -> Job:
    main, startup, model, optimizer = build_programs(spec)
    feeds = {name: main.global_block().var(name) for name in model.feeds}
    data = open_data(spec, feeds, model.make_batch, model.config.get("vocab_size"))
    dp = spec.dp_degree(layout.world_size)
    micro = spec.gradient_accumulation_steps
    rows = tuple(local_rows(spec.global_batch_size, layout.rank // layout.mp_degree, dp, i,
                            micro) for i in range(micro))
    rings = applied_rings()
    evaluator = None
    if data.eval is not None:
        # Validation batches are micro-batches (a rank's rows of one micro-step): the
        # memory gradient accumulation saves is not spent again on validation.
        evaluator = Evaluator(main.clone(for_test=True), _outputs(spec, model), data.eval,
                              spec.global_batch_size // micro, rows[0],
                              _dp_sum(rings[1]) if dp > 1 else None)
    return Job(spec, layout, main, startup, model, optimizer, data, rows, rings, evaluator)


def _outputs(spec: JobSpec, model) -> dict[str, str]:
    if "sample_loss" not in model.outputs:
        raise ConfigError(f"model {spec.model} names no per-sample loss (BuiltModel.outputs"
                          f"['sample_loss']), so it cannot be validated: drop "
                          f"validation_fraction and eval_data")
    return model.outputs


def _dp_sum(ring_id: int):
    return lambda totals: get_ring(ring_id).all_reduce(totals)
