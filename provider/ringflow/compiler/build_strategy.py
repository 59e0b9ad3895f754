"""``BuildStrategy`` (Paddle's switches that ringflow honours) and ``CompiledProgram``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class BuildStrategy:
    """How the executor prepares a program (Paddle's ``paddle.static.BuildStrategy`` names).

    - ``fuse_gemm_epilogue``: matmul_v2 + bias + ReLU become one ``fused_gemm_epilogue`` op
      (and their grads one ``fused_gemm_epilogue_grad``); results are bitwise the same.
    - ``fuse_all_reduce_ops``: the data-parallel gradient all-reduces become buckets of at
      most ``fuse_grad_size_in_MB`` (Paddle's default 32), one flat buffer each, the
      gradients views into it; a bucket is all-reduced as soon as its last gradient is
      written.
    - ``fuse_all_optimizer_ops``: the update ops of one kind (sgd, momentum, adam, adamw,
      lamb, lars_momentum) with one learning rate and the same attributes become one step
      over their parameters and state laid end to end (gradient buckets read as they lie);
      results are bitwise the same. On by default (Paddle's default is off; here it costs
      nothing in results).
    - ``overlap_comm``: run bucket all-reduces on a communication thread while the backward
      pass goes on (True), on the calling thread (False), or per ring (None: overlap where
      the ring crosses hosts over TCP, not among the ranks of one host, whose shared-memory
      all-reduce competes with the backward pass for the same cores; see the README).
    """

    fuse_gemm_epilogue: bool = True
    fuse_all_reduce_ops: bool = True
    fuse_grad_size_in_MB: float = 32.0
    fuse_all_optimizer_ops: bool = True
    overlap_comm: bool | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "fuse_grad_size_in_MB":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ConfigError(f"BuildStrategy.fuse_grad_size_in_MB must be a number "
                                      f"> 0, got {value!r}")
            elif f.name == "overlap_comm":
                if value is not None and not isinstance(value, bool):
                    raise ConfigError(f"BuildStrategy.overlap_comm must be True, False or "
                                      f"None, got {value!r}")
            elif not isinstance(value, bool):
                raise ConfigError(f"BuildStrategy.{f.name} must be True or False, got "
                                  f"{value!r}")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: Any) -> BuildStrategy:
        """A BuildStrategy of the fields in ``values`` (the others default)."""
        if not isinstance(values, dict):
            raise ConfigError(f"BuildStrategy fields must be a dict, got {values!r}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"BuildStrategy has no field {unknown[0]!r}; fields: "
                              f"{', '.join(known)}")
        return cls(**values)

    @property
    def bucket_bytes(self) -> int:
        return int(self.fuse_grad_size_in_MB * (1 << 20))


DEFAULT_BUILD_STRATEGY = BuildStrategy()


class CompiledProgram:
    """A program with the strategy the executor prepares it with, as Paddle's
    ``CompiledProgram(program, build_strategy=...)``; ``Executor.run`` takes either."""

    def __init__(self, program: Any, build_strategy: BuildStrategy | None = None) -> None:
        from ..framework.program import Program

        if not isinstance(program, Program):
            raise ConfigError(f"CompiledProgram takes a Program, got {type(program).__name__}")
        if build_strategy is not None and not isinstance(build_strategy, BuildStrategy):
            raise ConfigError(f"build_strategy must be a BuildStrategy, got "
                              f"{type(build_strategy).__name__}")
        self.program = program
        self.build_strategy = build_strategy or DEFAULT_BUILD_STRATEGY

    def global_block(self):
        return self.program.global_block()

    def __repr__(self) -> str:
        return f"CompiledProgram({self.build_strategy})"
