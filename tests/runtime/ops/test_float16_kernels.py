"""The kernels AMP runs in float16 (matmul, elementwise, activations, scale, dropout,
reshape/transpose) accept float16, keep it in their outputs and gradients, and agree with
the float32 computation rounded to float16; GEMMs and broadcast gradient sums accumulate in
float32 (numpy's float16 GEMM is a plain loop)."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.executor import Executor, Scope
from ringflow.framework.registry import get_op_def, grad_var_name
from ringflow.framework.verify import verify
from tests.runtime.gradcheck import build, forward

rng = np.random.default_rng(3)


def half(*shape):
    return rng.standard_normal(shape).astype(np.float16)


def grads(op_type: str, inputs: dict, attrs: dict | None = None, seed: int = 0) -> dict:
    """Runs the op and its grad ops on ``inputs``; returns input name -> gradient."""
    program, op, feed = build(op_type, inputs, attrs)
    block = program.global_block()
    descs = get_op_def(op_type).grad(op, frozenset())
    gen = np.random.default_rng(seed)
    for name in op.output_arg_names:
        if any(grad_var_name(name) in ns for d in descs for ns in d.inputs.values()):
            var = block.var(name)
            block.create_var(name=grad_var_name(name), shape=var.shape, dtype=var.dtype,
                             is_data=True)
            # values a float16 holds exactly, so both precisions see the same dOut
            dout = gen.standard_normal(var.shape).astype(np.float16)
            feed[grad_var_name(name)] = dout.astype(var.dtype)
    for d in descs:
        block.append_op(d.type, inputs=d.inputs, outputs=d.outputs, attrs=d.attrs)
    verify(program)
    names = [grad_var_name(n) for ns in op.inputs.values() for n in ns
             if feed[n].dtype.kind == "f"]
    values = Executor().run(program, feed=feed, fetch_list=names, scope=Scope())
    return dict(zip(names, values))


def as_float32(inputs: dict) -> dict:
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in inputs.items()}


def test_matmul_v2_in_float16_is_the_float32_product_rounded_once():
    x, y = half(4, 8, 16), half(16, 5)
    (out,) = forward("matmul_v2", {"X": x, "Y": y})["Out"]
    assert out.dtype == np.float16
    expected = (x.astype(np.float32) @ y.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("attrs", [{}, {"trans_y": True}], ids=["plain", "trans_y"])
def test_matmul_v2_gradients_in_float16_match_float32_within_rounding(attrs):
    y_shape = (5, 16) if attrs else (16, 5)
    inputs = {"X": half(4, 8, 16), "Y": half(*y_shape)}
    got, ref = grads("matmul_v2", inputs, attrs), grads("matmul_v2", as_float32(inputs), attrs)
    for name, value in got.items():
        assert value.dtype == np.float16, name
        np.testing.assert_allclose(value.astype(np.float32), ref[name], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op_type", ["elementwise_add", "elementwise_sub", "elementwise_mul",
                                     "elementwise_div"])
def test_elementwise_ops_keep_float16_and_a_bias_gradient_sums_in_float32(op_type):
    inputs = {"X": half(64, 8), "Y": (np.abs(half(8)) + 1).astype(np.float16)}
    (out,) = forward(op_type, inputs)["Out"]
    assert out.dtype == np.float16
    got, ref = grads(op_type, inputs), grads(op_type, as_float32(inputs))
    for name, value in got.items():
        assert value.dtype == np.float16, name
        # the broadcast sum over 64 rows is rounded once, not 64 times
        np.testing.assert_allclose(value.astype(np.float32), ref[name], rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("op_type, attrs", [
    ("relu", {}), ("tanh", {}), ("sigmoid", {}), ("gelu", {"approximate": True}),
    ("scale", {"scale": 0.5, "bias": 1.0}), ("reshape2", {"shape": [2, -1]}),
    ("transpose2", {"axis": [1, 0]}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_unary_ops_and_their_gradients_keep_float16(op_type, attrs):
    inputs = {"X": half(6, 4)}
    outs = forward(op_type, inputs, attrs)["Out"]
    ref_out = forward(op_type, as_float32(inputs), attrs)["Out"]
    assert outs[0].dtype == np.float16
    np.testing.assert_allclose(outs[0].astype(np.float32), ref_out[0], rtol=2e-3, atol=2e-3)
    got, ref = grads(op_type, inputs, attrs), grads(op_type, as_float32(inputs), attrs)
    for name, value in got.items():
        assert value.dtype == np.float16, name
        np.testing.assert_allclose(value.astype(np.float32), ref[name], rtol=3e-3, atol=3e-3)


def test_dropout_in_float16_keeps_the_dtype_and_masks_as_float32_does():
    attrs = {"dropout_prob": 0.5, "seed": 11, "fix_seed": True}
    inputs = {"X": half(8, 8)}
    out16 = forward("dropout", inputs, attrs)
    out32 = forward("dropout", as_float32(inputs), attrs)
    assert out16["Out"][0].dtype == np.float16
    np.testing.assert_array_equal(out16["Mask"][0], out32["Mask"][0])
    np.testing.assert_array_equal(out16["Out"][0], out32["Out"][0].astype(np.float16))
