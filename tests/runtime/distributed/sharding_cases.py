"""The sharded == unsharded matrix (issue 19), shared by the worker that trains every case
in one job per configuration and the test that trains the one-process reference.

CONFIGS are (world, mp, stage, hosts): stage 0 is plain data parallelism by Paddle's
default (a strategy without tensor_parallel or sharding: GraphExecutionOptimizer); the
4-rank jobs run on two "hosts" (127.0.0.1 and 127.0.0.2, two ranks each): mp groups inside
a host over shared memory, the sharding rings across the hosts."""

from __future__ import annotations

from dataclasses import dataclass

import ringflow as rf
from ringflow.distributed import fleet
from tests.runtime.distributed.tp_cases import Case

CONFIGS = [(2, 1, 0, 1), (2, 1, 1, 1), (2, 1, 2, 1), (4, 2, 1, 2), (4, 2, 2, 2), (4, 1, 2, 2)]
# the configurations that also train META_CASES (a meta-optimizer inside sharding)
META_CONFIGS = [(2, 1, 2, 1), (4, 2, 1, 2)]


@dataclass(frozen=True)
class ShardCase(Case):
    """A tp_cases.Case trained with sharding of ``stage`` (0: none) and ``mp`` ranks of
    tensor parallelism, in Paddle's hybrid form when ``hybrid``. ``runs``: "unfused" runs
    the program as it says (each reduce and broadcast an op, no buckets, no fused updates);
    "tiny-buckets" makes a bucket of about every gradient (stage 2: buckets take turns in
    two staging buffers)."""

    runs: str = ""

    @property
    def key(self) -> str:
        return "-".join(p for p in (super().key, self.runs) if p)

    def build_strategy(self):
        if self.runs == "unfused":
            return rf.BuildStrategy(fuse_all_reduce_ops=False, fuse_all_optimizer_ops=False)
        if self.runs == "tiny-buckets":
            return rf.BuildStrategy(fuse_grad_size_in_MB=0.001)
        return None

    def sharded_strategy(self, model: rf.models.BuiltModel, mp: int, stage: int,
                         hybrid: bool = False):
        strategy = self.strategy(model, mp if mp > 1 and not hybrid else None)
        if stage:
            strategy.sharding = True
            configs = {"stage": stage}
            if hybrid:
                configs["mp_degree"] = mp
            strategy.sharding_configs = configs
        return strategy

    def make_optimizer(self) -> rf.optimizer.Optimizer:
        if self.optimizer == "adamw-clip":
            return rf.optimizer.AdamW(0.01, epsilon=1e-6, weight_decay=0.05,
                                      grad_clip=rf.ClipGradByGlobalNorm(0.05))
        return super().make_optimizer()


CASES = [ShardCase("mlp", "adam", "float64"), ShardCase("mlp", "adamw-clip", "float64"),
         ShardCase("mlp", "lamb", "float64"), ShardCase("transformer", "adamw-clip", "float64"),
         ShardCase("mlp", "adam", "float32")]
META_CASES = [ShardCase("mlp", "adam", "float64", "lamb"),
              ShardCase("mlp", "momentum", "float64", "lars"),
              ShardCase("transformer", "adam", "float64", "recompute"),
              ShardCase("mlp", "sgd", "float32", "amp"),
              ShardCase("mlp", "adamw-clip", "float64", runs="unfused"),
              ShardCase("transformer", "adamw-clip", "float64", runs="tiny-buckets")]


def distributed(case: ShardCase, mp: int, stage: int):
    """The ``distributed_optimizer`` argument of tp_cases.build_programs: fleet with this
    case's strategy (the transformer cases in Paddle's hybrid form)."""
    hybrid = case.model == "transformer" and stage > 0

    def wrap(opt, model):
        return fleet.distributed_optimizer(opt, case.sharded_strategy(model, mp, stage, hybrid))

    return wrap
