"""Fused ops the executor substitutes when it prepares a program (``ringflow.compiler``):
``fused_gemm_epilogue`` (Paddle's name) is matmul_v2 + elementwise_add of a bias + an
optional ReLU, and its grad is relu_grad + elementwise_add_grad + matmul_v2_grad.

Each performs the same numpy operations in the same order as the ops it replaces, so its
results are bitwise those of the unfused ops; what it saves is arrays and passes over
memory: the bias and the ReLU are applied in place in the GEMM's output, and the ReLU's
gradient in place in dOut when nothing else reads dOut (attr ``inplace_grad``, set by the
compiler, which knows the readers).
"""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError
from ..framework.registry import register_op
from ._shapes import like_inputs, same_dtype
from .elementwise import _sum_into, aligned_shapes
from .matmul import matmul_shape, write_matmul, write_matmul_grads

ACTIVATIONS = ("none", "relu")
_ATTRS = {"trans_x": False, "trans_y": False, "activation": "none", "axis": -1}


def _activation(ctx) -> str:
    act = ctx.attr("activation") or "none"
    if act not in ACTIVATIONS:
        raise ProgramError(f"op {ctx.op.type!r}: activation must be one of {ACTIVATIONS}, "
                           f"got {act!r}")
    return act


def _infer(ctx) -> None:
    _activation(ctx)
    shape = matmul_shape(ctx.input_shape("X"), ctx.input_shape("Y"), bool(ctx.attr("trans_x")),
                         bool(ctx.attr("trans_y")), f"op {ctx.op.type!r}")
    ctx.set_output("Out", shape, same_dtype(ctx, "X", "Y"))


@register_op("fused_gemm_epilogue", inputs=["X", "Y", "Bias"], outputs=["Out"], attrs=_ATTRS,
             infer_shape=_infer)
def _fused_gemm_epilogue(ctx) -> None:
    out = write_matmul(ctx, ctx.input("X"), ctx.input("Y"), "Out")
    _, bias = aligned_shapes(out.shape, ctx.input("Bias").shape, int(ctx.attr("axis")))
    np.add(out, ctx.input("Bias").reshape(bias), out=out)   # elementwise_add, in place
    if _activation(ctx) == "relu":
        np.maximum(out, 0, out=out)                          # relu, in place
    ctx.set_output("Out", out)


@register_op("fused_gemm_epilogue_grad", inputs=["X", "Y", "Bias", "Out?", "Out@GRAD"],
             outputs=["X@GRAD?", "Y@GRAD?", "Bias@GRAD?"],
             attrs={**_ATTRS, "inplace_grad": False},
             infer_shape=like_inputs(("X", "X@GRAD"), ("Y", "Y@GRAD"), ("Bias", "Bias@GRAD")))
def _fused_gemm_epilogue_grad(ctx) -> None:
    dpre = _pre_activation_grad(ctx)
    if ctx.has_output("Bias@GRAD"):            # elementwise_add_grad's Y@GRAD
        bias = ctx.input("Bias")
        _, aligned = aligned_shapes(dpre.shape, bias.shape, int(ctx.attr("axis")))
        grad = ctx.buffer("Bias@GRAD", bias.shape, dpre.dtype)
        _sum_into(dpre, aligned, grad)
        ctx.set_output("Bias@GRAD", grad)
    # elementwise_add_grad hands dOut on as its X@GRAD: matmul_v2_grad's Out@GRAD is dpre
    write_matmul_grads(ctx, ctx.input("X"), ctx.input("Y"), dpre, "X@GRAD", "Y@GRAD")


def _pre_activation_grad(ctx) -> np.ndarray:
    """relu_grad's X@GRAD (dOut * (Out > 0)), in dOut's own array when ``inplace_grad``;
    dOut itself without an activation."""
    dout = ctx.input("Out@GRAD")
    if _activation(ctx) == "none":
        return dout
    out = ctx.input("Out")
    # in place only into an array the executor made for dOut itself (not one dOut shares
    # with another gradient it was handed on from)
    if ctx.attr("inplace_grad") and ctx.executor.owns(ctx.op.inputs["Out@GRAD"][0], dout):
        np.multiply(dout, out > 0, out=dout)
        return dout
    dpre = np.empty(out.shape, dout.dtype)
    np.multiply(dout, out > 0, out=dpre)
    return dpre
