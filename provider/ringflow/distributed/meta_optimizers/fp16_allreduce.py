"""``fp16_allreduce`` (Paddle's FP16AllReduceOptimizer): the data-parallel all-reduce of
each float32 parameter gradient moves float16, half the bytes; the gradient is cast to
float16 before it and back after it, so the update reads float32 rounded to float16
precision. Applied by fleet to the programs the chain built; other all-reduces (the
activation gradients of tensor parallelism, clip norms) stay as they are.

    cast                 g@FP16 = float16(g)
    c_allreduce_sum      g@FP16 (the data-parallel ring)
    cast                 g = float32(g@FP16)
"""

from __future__ import annotations

from ...errors import ConfigError
from ...framework.program import Block
from ...framework.roles import OP_ROLE_KEY, OpRole
from .gradient_merge import param_grads

SUFFIX = "@FP16"


def check_strategy(strategy) -> bool:
    """Whether it applies; with sharding (whose reductions are not all-reduces) a
    ConfigError."""
    if not strategy.fp16_allreduce:
        return False
    if strategy.sharding:
        raise ConfigError("fp16_allreduce with sharding is not supported by ringflow (it "
                          "applies to the all-reduces of data parallelism)")
    return True


def apply(block: Block) -> list[str]:
    """Rewrites each all-reduce of a float32 parameter gradient to move float16; returns
    the gradients' names."""
    grads = set(param_grads(block)) if block.find_ops(lambda op: op.type == "c_allreduce_sum") \
        else set()
    role = {OP_ROLE_KEY: int(OpRole.Backward)}
    done = []
    for op in list(block.ops):
        if op.type != "c_allreduce_sum" or op.input("X")[0] not in grads:
            continue
        grad = op.input("X")[0]
        var = block.var(grad)
        if str(var.dtype) != "float32":
            continue
        half = block.create_var(name=grad + SUFFIX, shape=var.shape, dtype="float16",
                                stop_gradient=True)
        block.insert_op_before(op, "cast", inputs={"X": [grad]}, outputs={"Out": [half]},
                               attrs={"in_dtype": "float32", "out_dtype": "float16", **role})
        block.rename_var_in_op(op, grad, half.name)
        block.insert_op_after(op, "cast", inputs={"X": [half]}, outputs={"Out": [grad]},
                              attrs={"in_dtype": "float16", "out_dtype": "float32", **role})
        done.append(grad)
    return done
