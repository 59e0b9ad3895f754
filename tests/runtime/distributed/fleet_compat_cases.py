"""The Paddle-form strategies of issue 22 trained in parallel == one process, shared by the
worker (which trains every case in one job per configuration) and the test (which trains
the one-process reference).

CONFIGS are (world, mp) on two "hosts" (127.0.0.1 and 127.0.0.2). Each case sets the
degrees the way Paddle 2.x/3.x scripts do, through ``hybrid_configs`` (data parallelism,
tensor parallelism, or sharding over the data-parallel ranks), and some train with
``gradient_merge``: K micro-steps of batch GLOBAL_BATCH / K per step, against one process
taking one step of batch GLOBAL_BATCH."""

from __future__ import annotations

from dataclasses import dataclass

from ringflow.distributed import fleet
from tests.runtime.distributed.tp_cases import AMP_TOLERANCE, GLOBAL_BATCH, Case

CONFIGS = [(2, 1), (2, 2), (4, 2)]
K = 2   # gradient merge micro-steps per step


@dataclass(frozen=True)
class CompatCase(Case):
    """A tp_cases.Case whose degrees come from hybrid_configs; ``form`` "hybrid" (dp x mp),
    "sharding" (sharding_degree = dp), "merge" (hybrid with gradient_merge of K steps,
    avg) or "fp16" (hybrid with fp16_allreduce: within float16 rounding of float32)."""

    form: str = "hybrid"

    @property
    def key(self) -> str:
        return f"{super().key}-{self.form}"

    def tolerance(self, what: str) -> dict:
        return AMP_TOLERANCE[what] if self.form == "fp16" else super().tolerance(what)

    @property
    def micro_steps(self) -> int:
        return K if self.form == "merge" else 1

    def paddle_strategy(self, world: int, mp: int) -> fleet.DistributedStrategy:
        strategy = fleet.DistributedStrategy()
        if self.form == "sharding":
            strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": mp,
                                       "sharding_degree": world // mp}
        else:
            strategy.hybrid_configs = {"dp_degree": world // mp, "mp_degree": mp,
                                       "pp_degree": 1}
        if self.form == "fp16":
            strategy.fp16_allreduce = True
        if self.form == "merge":
            strategy.gradient_merge = True
            strategy.gradient_merge_configs = {"k_steps": K, "avg": True}
        return strategy


CASES = [CompatCase("mlp", "adam", "float64"), CompatCase("mlp", "sgd", "float64", form="merge"),
         CompatCase("mlp", "adam", "float64", form="merge"),
         CompatCase("transformer", "adam", "float64", form="merge"),
         CompatCase("mlp", "adam", "float64", form="sharding"),
         CompatCase("mlp", "sgd", "float32", form="fp16")]


def cases(world: int, mp: int) -> list[CompatCase]:
    """The cases a configuration trains (sharding and fp16 all-reduces only where there are
    data-parallel ranks)."""
    return [c for c in CASES if c.form not in ("sharding", "fp16") or world // mp > 1]


def micro_rows(micro: int, dp_rank: int, dp: int, micro_steps: int) -> slice:
    """Rows of the global batch that data-parallel rank ``dp_rank`` feeds at micro-step
    ``micro``: the micro-batches split the batch in order, each split over the ranks."""
    per_micro = GLOBAL_BATCH // micro_steps
    per_rank = per_micro // dp
    start = micro * per_micro + dp_rank * per_rank
    return slice(start, start + per_rank)
