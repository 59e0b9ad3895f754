"""The parallel == serial matrix, shared by the tensor-parallel workers (which train every
case) and the tests (which train the serial reference and compare): models, optimizers,
dtypes, the seed, the steps and the global batch. ``META_CASES`` add a meta-optimizer of
TensorParallelOptimizer's white list (Lamb or LARS by strategy, Recompute, AMP), trained by
the ``META_CONFIGS`` jobs and compared with one process running the same meta-optimizer."""

from __future__ import annotations

from dataclasses import dataclass

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.models import mlp, transformer

SEED = 7
STEPS = 5
GLOBAL_BATCH = 8
# (world size, tensor-parallel degree, hosts): mp x dp = 2x1, 1x2, 2x2, 4x1, 4x2. The 2x2 job
# runs on two "hosts" (127.0.0.1 and 127.0.0.2): mp groups inside a host over shared memory,
# the dp rings across hosts over TCP, as a real multi-host job lays them out.
CONFIGS = [(2, 2, 1), (2, 1, 1), (4, 2, 2), (4, 4, 1), (8, 4, 1)]
TOLERANCE = {"float64": dict(rtol=1e-10, atol=1e-12), "float32": dict(rtol=1e-5, atol=1e-6)}
# (world size, degree, hosts) that also train META_CASES
META_CONFIGS = [(2, 2, 1), (2, 1, 1)]
# float16 compute: a sharded or data-parallel sum is rounded to float16 at other points than
# the serial one (each rank's partial GEMM, each rank's gradient before the all-reduce)
AMP_TOLERANCE = {"loss": dict(rtol=1e-3, atol=1e-6), "params": dict(rtol=1e-3, atol=5e-4)}


@dataclass(frozen=True)
class Case:
    model: str
    optimizer: str
    dtype: str
    meta: str = ""      # "", "lamb", "lars", "recompute" or "amp": a strategy feature

    @property
    def key(self) -> str:
        return "-".join(p for p in (self.model, self.meta, self.optimizer, self.dtype) if p)

    def tolerance(self, what: str) -> dict:
        """How close to one process: ``what`` is "loss" or "params"."""
        return AMP_TOLERANCE[what] if self.meta == "amp" else TOLERANCE[self.dtype]

    def strategy(self, model: rf.models.BuiltModel, mp_degree: int | None):
        """The fleet strategy: this case's feature, with tensor parallelism of ``mp_degree``
        (None: none, one process running the meta-optimizer alone)."""
        strategy = fleet.DistributedStrategy()
        if mp_degree is not None:
            strategy.tensor_parallel = True
            strategy.tensor_parallel_configs = {"tensor_parallel_degree": mp_degree}
        if self.meta:
            setattr(strategy, self.meta, True)
        if self.meta == "recompute":
            strategy.recompute_configs = {"checkpoints": model.checkpoints}
        elif self.meta == "lars":
            strategy.lars_configs = {"lars_weight_decay": 0.001}
        elif self.meta == "amp":
            strategy.amp_configs = {"init_loss_scaling": 1024.0}
        return strategy

    def build(self, mp_degree: int) -> rf.models.BuiltModel:
        """The model, built into the default programs (inside ``program_guard``)."""
        if self.model == "mlp":
            return mlp(input_size=16, hidden_size=32, num_classes=8, num_layers=2,
                       mp_degree=mp_degree, dtype=self.dtype)
        return transformer(vocab_size=32, seq_len=8, hidden_size=16, num_heads=4,
                           num_layers=2, ffn_size=32, mp_degree=mp_degree, dtype=self.dtype)

    def make_optimizer(self) -> rf.optimizer.Optimizer:
        # A clip norm the gradients exceed at every step, so the clip (and under tensor
        # parallelism its norm all-reduce) acts on every update. Adam's epsilon is 1e-6, not
        # 1e-8: a gradient element of order 1e-8 (a hidden unit that is almost never active)
        # would turn the float32 rounding differences of sharded and serial sums (1e-7
        # relative, expected) into update differences of 1e-4 relative.
        clip = rf.ClipGradByGlobalNorm(0.05)
        return {
            "sgd": lambda: rf.optimizer.SGD(0.1),
            "adam-clip": lambda: rf.optimizer.Adam(0.01, epsilon=1e-6, grad_clip=clip),
            "lamb": lambda: rf.optimizer.Lamb(0.01),
            "lars": lambda: rf.optimizer.Lars(0.1, momentum=0.9, lars_weight_decay=0.001),
            "adam": lambda: rf.optimizer.Adam(0.01, epsilon=1e-6),
            "momentum": lambda: rf.optimizer.Momentum(0.1, momentum=0.9),
        }[self.optimizer]()


CASES = [Case(model, opt, dtype)
         for model, opts in (("mlp", ("sgd", "adam-clip", "lamb", "lars")),
                             ("transformer", ("sgd", "adam-clip")))
         for opt in opts for dtype in ("float64", "float32")]


# Lamb and LARS by strategy turn the user's Adam / Momentum into them; Recompute wraps Adam;
# AMP wraps SGD: Adam would turn the float16 rounding differences of a gradient element near
# zero into update differences of the order of the learning rate.
META_CASES = [Case("mlp", "adam", "float64", "lamb"), Case("mlp", "momentum", "float64", "lars"),
              Case("mlp", "adam", "float64", "recompute"),
              Case("transformer", "adam", "float64", "recompute"),
              Case("mlp", "sgd", "float32", "amp"), Case("transformer", "sgd", "float32", "amp")]


def build_programs(case: Case, mp_degree: int, distributed_optimizer=None):
    """(main, startup, model); ``distributed_optimizer(opt, model)`` wraps the optimizer
    (fleet)."""
    main, startup = rf.Program(), rf.Program()
    startup.random_seed = SEED
    with rf.program_guard(main, startup):
        model = case.build(mp_degree)
        opt = case.make_optimizer()
        if distributed_optimizer is not None:
            opt = distributed_optimizer(opt, model)
        opt.minimize(model.loss)
    return main, startup, model


def rows(dp_rank: int, dp_degree: int) -> slice:
    """Data-parallel rank r takes rows [r B/dp, (r+1) B/dp) of each global batch."""
    per = GLOBAL_BATCH // dp_degree
    return slice(dp_rank * per, (dp_rank + 1) * per)
