"""Every op of the runtime families: float32 in gives float32 out (with inferred metas
matching), and every differentiable op has a grad maker whose grad ops are registered.
The table below is checked against the registry, so a new op cannot skip it."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.framework.registry import get_op_def, has_op_def, registered_op_types
from tests.runtime.gradcheck import build, forward

rng = np.random.default_rng(23)


def f32(*shape):
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)


IDS = np.array([[1, 0], [2, 1]], np.int64)
# op type -> (inputs, attrs, outputs or None for the required ones)
CASES = {
    "scale": ({"X": f32(2, 3)}, {"scale": 2.0, "bias": 1.0}, None),
    "cast": ({"X": f32(2, 3)}, {"in_dtype": "float32", "out_dtype": "float32"}, None),
    "sum": ({"X": [f32(2, 3), f32(2, 3)]}, {}, None),
    "mean": ({"X": f32(2, 3)}, {}, None),
    "reduce_sum": ({"X": f32(2, 3)}, {"dim": [1]}, None),
    "reduce_mean": ({"X": f32(2, 3)}, {"dim": [0], "keep_dim": True}, None),
    "sqrt": ({"X": f32(2, 3)}, {}, None),
    "square": ({"X": f32(2, 3)}, {}, None),
    "elementwise_add": ({"X": f32(2, 3), "Y": f32(3)}, {}, None),
    "elementwise_sub": ({"X": f32(2, 3), "Y": f32(3)}, {}, None),
    "elementwise_mul": ({"X": f32(2, 3), "Y": f32(3)}, {}, None),
    "elementwise_div": ({"X": f32(2, 3), "Y": f32(3)}, {}, None),
    "elementwise_max": ({"X": f32(2, 3), "Y": f32(3)}, {}, None),
    "elementwise_min": ({"X": f32(2, 3), "Y": f32(3)}, {}, None),
    "matmul_v2": ({"X": f32(2, 3), "Y": f32(3, 4)}, {}, None),
    "mul": ({"X": f32(2, 3), "Y": f32(3, 4)}, {}, None),
    "relu": ({"X": f32(2, 3)}, {}, None),
    "tanh": ({"X": f32(2, 3)}, {}, None),
    "sigmoid": ({"X": f32(2, 3)}, {}, None),
    "gelu": ({"X": f32(2, 3)}, {}, None),
    "exp": ({"X": f32(2, 3)}, {}, None),
    "log": ({"X": f32(2, 3)}, {}, None),
    "softmax": ({"X": f32(2, 3)}, {}, None),
    "layer_norm": ({"X": f32(2, 3), "Scale": f32(3), "Bias": f32(3)}, {}, None),
    "dropout": ({"X": f32(2, 3)}, {"seed": 1}, None),
    "lookup_table_v2": ({"W": f32(3, 4), "Ids": IDS}, {}, None),
    "softmax_with_cross_entropy": ({"Logits": f32(2, 3), "Label": IDS[:, :1]}, {}, None),
    "reshape2": ({"X": f32(2, 3)}, {"shape": [3, 2]}, ["Out", "XShape"]),
    "transpose2": ({"X": f32(2, 3)}, {"axis": [1, 0]}, ["Out", "XShape"]),
    "squeeze2": ({"X": f32(2, 1)}, {"axes": [1]}, ["Out", "XShape"]),
    "unsqueeze2": ({"X": f32(2, 3)}, {"axes": [0]}, ["Out", "XShape"]),
    "concat": ({"X": [f32(2, 3), f32(2, 1)]}, {"axis": 1}, None),
    "split": ({"X": f32(2, 4)}, {"num": 2, "axis": 1}, {"Out": 2}),
    "slice": ({"Input": f32(4, 3)}, {"axes": [0], "starts": [1], "ends": [3]}, None),
    "assign": ({"X": f32(2, 3)}, {}, None),
    "tril_triu": ({"X": f32(3, 3)}, {"diagonal": 0, "lower": True}, None),
}


@pytest.mark.parametrize("op", CASES)
def test_float32_inputs_give_float32_outputs(op):
    inputs, attrs, outputs = CASES[op]
    outs = forward(op, inputs, attrs, outputs)   # also checks the inferred metas
    for slot, arrays in outs.items():
        for a in arrays:
            if slot not in ("Mask", "XShape"):
                assert a.dtype == np.float32, f"{op}: {slot} is {a.dtype}"


@pytest.mark.parametrize("op", CASES)
def test_differentiable_op_has_registered_grad_ops(op):
    inputs, attrs, outputs = CASES[op]
    _, fwd, _ = build(op, inputs, attrs, outputs)
    descs = get_op_def(op).grad(fwd, frozenset())
    assert descs, f"{op} has no grad op"
    for d in descs:
        assert has_op_def(d.type), f"{op}: grad op {d.type} is not registered"
    # an input in the no-grad set gets no gradient; with all of them there is no grad op
    assert get_op_def(op).grad(fwd, frozenset(fwd.input_arg_names)) == []


# Families of this table (update ops and collectives are tested with their own families).
FAMILIES = {f"ringflow.ops.{m}" for m in (
    "activation", "compare", "creation", "elementwise", "loss", "math", "matmul", "nn",
    "tensor")}
NO_GRADIENT = {"fill_constant", "fill_zeros_like", "uniform_random", "gaussian_random",
               "equal", "not_equal", "less_than", "less_equal", "greater_than",
               "greater_equal", "arg_max", "arg_min"}


def test_every_forward_op_of_the_families_is_in_the_table_or_has_no_gradient():
    forward_ops = [t for t in registered_op_types() if not t.endswith("_grad")
                   and get_op_def(t).kernel.__module__ in FAMILIES]
    assert sorted(t for t in forward_ops if get_op_def(t).grad is None) == sorted(NO_GRADIENT)
    assert sorted(t for t in forward_ops if get_op_def(t).grad is not None) == sorted(CASES)
