"""What the executor does to a program before it runs it, as Paddle's ``BuildStrategy`` /
``CompiledProgram`` do: fused ops (``fuse_gemm``) and gradient all-reduces coalesced into
buckets run on a communication thread (``buckets``). None of it is written into the
Program: a printed program and the rewrite tests stay as they are; ``Executor.prepared``
shows the plan a program runs as."""

from .build_strategy import BuildStrategy, CompiledProgram
from .plan import Plan, Step, prepare

__all__ = ["BuildStrategy", "CompiledProgram", "Plan", "Step", "prepare"]
