"""Runtime fixtures: scratch ops that exist only while a test runs, and ``net``, a small
builder of real-op programs (fc = matmul_v2 + elementwise_add, as ringflow.nn builds it).

Tests of the IR, the executor and the verifier use the scratch ops instead of the real op
families so they state exactly what the op does and do not change when a real kernel does.
"""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.framework.layer_helper import create_parameter
from ringflow.framework.registry import (
    OpDesc,
    _unregister_op,
    grad_var_name,
    register_op,
    same_shape_as,
)


def _infer_fill(ctx) -> None:
    ctx.set_output("Out", ctx.attr("shape"), ctx.attr("dtype"))


def _fill(ctx) -> None:
    ctx.set_output("Out", np.full(ctx.attr("shape"), ctx.attr("value"), ctx.attr("dtype")))


def _scale(ctx) -> None:
    ctx.set_output("Out", ctx.input("X") * ctx.attr("scale"))


def _scale_grad_maker(op, no_grad):
    x = op.input("X")[0]
    if x in no_grad:
        return []
    return [OpDesc("rft_scale", {"X": [grad_var_name(op.output("Out")[0])]},
                   {"Out": [grad_var_name(x)]}, {"scale": op.attr("scale")})]


def _infer_binary(ctx) -> None:
    # Y broadcasts against X; the output has X's shape.
    x, y = ctx.input_shape("X"), ctx.input_shape("Y")
    if len(x) != len(y) or any(b not in (1, a) and -1 not in (a, b) for a, b in zip(x, y)):
        raise ValueError(f"Y{list(y)} does not broadcast to X{list(x)}")
    ctx.set_output("Out", ctx.input_shape("X"), ctx.input_dtype("X"))


def _add(ctx) -> None:
    ctx.set_output("Out", ctx.input("X") + ctx.input("Y"))


def _log(ctx) -> None:
    ctx.set_output("Out", np.log(ctx.input("X")))


def _buffered_copy(ctx) -> None:
    x = ctx.input("X")
    out = ctx.buffer("Out", x.shape, x.dtype)
    np.copyto(out, x)
    ctx.set_output("Out", out)


def _drop(ctx) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", x if ctx.attr("is_test") else np.zeros_like(x))


def _update(ctx) -> None:
    lr = ctx.input("LearningRate").reshape(-1)[0]
    ctx.set_output("ParamOut", ctx.input("Param") - lr * ctx.input("Grad"))


def _rand(ctx) -> None:
    ctx.set_output("Out", ctx.rng().random(ctx.attr("shape")))


SCRATCH_OPS = {
    "rft_fill": dict(inputs=[], outputs=["Out"],
                     attrs={"shape": [1], "value": 0.0, "dtype": "float32"},
                     infer_shape=_infer_fill, kernel=_fill),
    "rft_scale": dict(inputs=["X"], outputs=["Out"], attrs={"scale": 1.0},
                      infer_shape=same_shape_as(), kernel=_scale, grad=_scale_grad_maker),
    "rft_add": dict(inputs=["X", "Y"], outputs=["Out"], infer_shape=_infer_binary,
                    kernel=_add),
    "rft_log": dict(inputs=["X"], outputs=["Out"], infer_shape=same_shape_as(), kernel=_log),
    "rft_copy": dict(inputs=["X"], outputs=["Out"], infer_shape=same_shape_as(),
                     kernel=_buffered_copy),
    "rft_drop": dict(inputs=["X"], outputs=["Out"], attrs={"is_test": False},
                     infer_shape=same_shape_as(), kernel=_drop),
    "rft_update": dict(inputs=["Param", "Grad", "LearningRate"], outputs=["ParamOut"],
                       infer_shape=same_shape_as("Param", "ParamOut"), kernel=_update),
    "rft_concat": dict(inputs=["X*"], outputs=["Out"], attrs={"axis": 0},
                       kernel=lambda ctx: ctx.set_output(
                           "Out", np.concatenate(ctx.inputs("X"), ctx.attr("axis")))),
    "rft_rand": dict(inputs=[], outputs=["Out"], attrs={"shape": [4], "seed": 0},
                     infer_shape=lambda ctx: ctx.set_output("Out", ctx.attr("shape"), "float64"),
                     kernel=_rand),
}


@pytest.fixture
def scratch_ops():
    """Registers the rft_* ops above for one test and removes them after it."""
    for name, spec in SCRATCH_OPS.items():
        spec = dict(spec)
        kernel = spec.pop("kernel")
        register_op(name, **spec)(kernel)
    try:
        yield sorted(SCRATCH_OPS)
    finally:
        for name in SCRATCH_OPS:
            _unregister_op(name)


class Net:
    """Builds programs from real ops without ringflow.nn: ``net.op(type, **inputs)`` appends
    one op to the main program and returns its output variable."""

    def __init__(self, main):
        self.main, self.block = main, main.global_block()

    def op(self, type, out="Out", attrs=None, **inputs):
        name = self.main.unique_name(type)
        self.block.append_op(type, inputs=inputs, outputs={out: name}, attrs=attrs)
        return self.block.var(name)

    def fc(self, x, size, act=None, weight=None, bias=True):
        w = weight or create_parameter([x.shape[-1], size], x.dtype)
        h = self.op("matmul_v2", X=x, Y=w)
        if bias:
            h = self.op("elementwise_add", X=h, Y=create_parameter([size], x.dtype, is_bias=True))
        return self.op(act, X=h) if act else h

    def mean(self, x):
        return self.op("reduce_mean", X=x, attrs={"reduce_all": True})

    def xent(self, logits, label):
        loss = self.main.unique_name("xent")
        self.block.append_op("softmax_with_cross_entropy", inputs={"Logits": logits,
                                                                   "Label": label},
                             outputs={"Softmax": loss + ".softmax", "Loss": loss})
        return self.block.var(loss)


@pytest.fixture
def net():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        yield Net(main)
