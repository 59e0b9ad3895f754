"""Layer functions, as Paddle's static ``nn``: ``fc``, ``embedding``, ``layer_norm``,
``dropout`` (which create parameters) and functional wrappers, one op each.

Each appends ops to the current block of the default main program; output variables get
their shapes and dtypes from the op's shape inference (``Block.append_op``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import ProgramError
from .framework.layer_helper import create_parameter
from .framework.program import Variable, default_main_program
from .initializer import Constant
from .seeds import stable_seed

__all__ = [
    "add", "cast", "concat", "cross_entropy", "divide", "dropout", "embedding", "exp", "fc",
    "gelu", "layer_norm", "log", "matmul", "maximum", "mean", "minimum", "multiply", "reduce_mean",
    "reduce_sum", "relu", "reshape", "scale", "sigmoid", "slice", "softmax",
    "softmax_with_cross_entropy", "split", "sqrt", "square", "squeeze", "subtract", "tanh",
    "transpose", "unsqueeze",
]


def _append(type: str, inputs: dict, attrs: dict | None = None, outputs: Sequence[str] = ("Out",),
            hidden: Sequence[str] = (), counts: dict[str, int] | None = None,
            name: str | None = None) -> dict[str, list[Variable]]:
    """Appends one ``type`` op with fresh output variables (``<name or type>.tmp_<k>``);
    ``hidden`` outputs (XShape, Mask, statistics) are marked stop_gradient."""
    block = default_main_program().current_block()
    outs = {slot: [block.program.unique_name(f"{name or type}.tmp")
                   for _ in range((counts or {}).get(slot, 1))]
            for slot in (*outputs, *hidden)}
    block.append_op(type, inputs=inputs, outputs=outs, attrs=attrs or {})
    result = {slot: [block.var(n) for n in names] for slot, names in outs.items()}
    for slot in hidden:
        for v in result[slot]:
            v.stop_gradient = True
    return result


def _op(type: str, inputs: dict, attrs: dict | None = None, **kw: Any) -> Variable:
    return _append(type, inputs, attrs, **kw)["Out"][0]


# layers with parameters ----------------------------------------------------------------------
def _require_float(layer: str, x: Variable) -> None:
    if np.dtype(x.dtype).kind != "f":
        raise ProgramError(f"{layer}: input {x.name!r} is {x.dtype}; {layer} needs a float "
                           f"input (its parameters take the input's dtype)")


_ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid", "softmax")


def fc(x: Variable, size: int, weight_attr: Any = None, bias_attr: Any = None,
       activation: str | None = None, name: str | None = None) -> Variable:
    """y = activation(x W + b): W [in, size] with in = x's last dim (``matmul_v2``), b [size]
    (``elementwise_add``; ``bias_attr=False``: none). Parameters take x's dtype."""
    if activation is not None and activation not in _ACTIVATIONS:
        raise ProgramError(f"fc: unknown activation {activation!r}; one of {_ACTIVATIONS}")
    _require_float("fc", x)
    in_dim = x.shape[-1] if x.shape else -1
    if in_dim <= 0:
        raise ProgramError(f"fc: the last dim of {x.name!r} {list(x.shape or [])} must be known")
    w = create_parameter([in_dim, size], x.dtype, attr=weight_attr, prefix="fc", layer_name=name)
    y = _op("matmul_v2", {"X": [x], "Y": [w]}, name=name)
    b = create_parameter([size], x.dtype, attr=bias_attr, is_bias=True, prefix="fc",
                         layer_name=name)
    if b is not None:
        y = _op("elementwise_add", {"X": [y], "Y": [b]}, {"axis": -1}, name=name)
    return _op(activation, {"X": [y]}) if activation else y


def embedding(input: Variable, size: Sequence[int], padding_idx: int | None = None,
              weight_attr: Any = None, is_sparse: bool = False, dtype: Any = "float32",
              name: str | None = None) -> Variable:
    """Rows of a [vocab, dim] table picked by int64 ids (``lookup_table_v2``); rows of
    ``padding_idx`` (negative: counted from the end) are zero and get no gradient."""
    vocab, dim = (int(s) for s in size)
    if padding_idx is None:
        pad = -1
    else:
        pad = padding_idx if padding_idx >= 0 else vocab + padding_idx
        if not 0 <= pad < vocab:
            raise ProgramError(f"embedding: padding_idx {padding_idx} is out of range for "
                               f"{vocab} rows")
    w = create_parameter([vocab, dim], dtype, attr=weight_attr, prefix="embedding",
                         layer_name=name)
    return _op("lookup_table_v2", {"W": [w], "Ids": [input]},
               {"padding_idx": pad, "is_sparse": bool(is_sparse)}, name=name)


def layer_norm(x: Variable, begin_norm_axis: int = 1, epsilon: float = 1e-5,
               weight_attr: Any = None, bias_attr: Any = None,
               name: str | None = None) -> Variable:
    """Normalises over dims [begin_norm_axis, ...) with a learned scale (init 1) and shift
    (init 0) of that many elements; ``weight_attr``/``bias_attr`` False drops one."""
    _require_float("layer_norm", x)
    right = x.shape[begin_norm_axis:]
    if any(d < 0 for d in right):
        raise ProgramError(f"layer_norm: dims {begin_norm_axis}.. of {x.name!r} "
                           f"{list(x.shape)} must be known")
    n = int(np.prod(right))
    inputs = {"X": [x]}
    scale = create_parameter([n], x.dtype, attr=weight_attr, default_initializer=Constant(1.0),
                             prefix="layer_norm", layer_name=name)
    bias = create_parameter([n], x.dtype, attr=bias_attr, is_bias=True, prefix="layer_norm",
                            layer_name=name)
    if scale is not None:
        inputs["Scale"] = [scale]
    if bias is not None:
        inputs["Bias"] = [bias]
    attrs = {"epsilon": float(epsilon), "begin_norm_axis": int(begin_norm_axis)}
    return _append("layer_norm", inputs, attrs, outputs=("Y",), hidden=("Mean", "Variance"),
                   name=name)["Y"][0]


_DROPOUT_MODES = {"upscale_in_train": "upscale_in_train",
                  "downscale_in_infer": "downgrade_in_infer",
                  "downgrade_in_infer": "downgrade_in_infer"}


def dropout(x: Variable, p: float = 0.5, training: bool = True, mode: str = "upscale_in_train",
            seed: int | None = None, name: str | None = None) -> Variable:
    """Zeroes elements with probability ``p`` (a new mask every step, from the program's
    seed); ``training=False`` or a ``clone(for_test=True)`` makes it the identity (or a
    scaling by 1 - p in ``downscale_in_infer`` mode). ``seed`` fixes one mask for all steps."""
    if mode not in _DROPOUT_MODES:
        raise ProgramError(f"dropout: unknown mode {mode!r}; one of {sorted(_DROPOUT_MODES)}")
    if not 0.0 <= p <= 1.0:
        raise ProgramError(f"dropout: p must be in [0, 1], got {p}")
    block = default_main_program().current_block()
    # The k-th dropout layer of a program gets the same seed in every build of the model,
    # whatever other ops a rewrite (tensor parallelism) adds or renames around it.
    k = sum(op.type == "dropout" for op in block.ops)
    op_seed = int(seed) if seed is not None else stable_seed("dropout", k) or 1
    attrs = {"dropout_prob": float(p), "is_test": not training, "seed": op_seed,
             "fix_seed": seed is not None, "dropout_implementation": _DROPOUT_MODES[mode]}
    return _append("dropout", {"X": [x]}, attrs, hidden=("Mask",), name=name)["Out"][0]


# activations and losses ---------------------------------------------------------------------
def relu(x: Variable, name: str | None = None) -> Variable:
    return _op("relu", {"X": [x]}, name=name)


def gelu(x: Variable, approximate: bool = False, name: str | None = None) -> Variable:
    return _op("gelu", {"X": [x]}, {"approximate": bool(approximate)}, name=name)


def tanh(x: Variable, name: str | None = None) -> Variable:
    return _op("tanh", {"X": [x]}, name=name)


def sigmoid(x: Variable, name: str | None = None) -> Variable:
    return _op("sigmoid", {"X": [x]}, name=name)


def exp(x: Variable, name: str | None = None) -> Variable:
    return _op("exp", {"X": [x]}, name=name)


def log(x: Variable, name: str | None = None) -> Variable:
    return _op("log", {"X": [x]}, name=name)


def sqrt(x: Variable, name: str | None = None) -> Variable:
    return _op("sqrt", {"X": [x]}, name=name)


def square(x: Variable, name: str | None = None) -> Variable:
    return _op("square", {"X": [x]}, name=name)


def softmax(x: Variable, axis: int = -1, name: str | None = None) -> Variable:
    return _op("softmax", {"X": [x]}, {"axis": int(axis)}, name=name)


def softmax_with_cross_entropy(logits: Variable, label: Variable, soft_label: bool = False,
                               ignore_index: int = -100, axis: int = -1,
                               return_softmax: bool = False):
    """Per-row loss [N, 1] of int64 labels [N] or [N, 1] (or soft labels like ``logits``);
    with ``return_softmax`` also the softmax."""
    attrs = {"soft_label": bool(soft_label), "ignore_index": int(ignore_index),
             "axis": int(axis)}
    outs = _append("softmax_with_cross_entropy", {"Logits": [logits], "Label": [label]}, attrs,
                   outputs=("Softmax", "Loss"))
    return (outs["Loss"][0], outs["Softmax"][0]) if return_softmax else outs["Loss"][0]


def cross_entropy(input: Variable, label: Variable, soft_label: bool = False,
                  ignore_index: int = -100, reduction: str = "mean", axis: int = -1) -> Variable:
    """``softmax_with_cross_entropy`` reduced by ``reduction`` ("mean", "sum", "none"); with
    hard labels "mean" divides by the number of rows not ignored (0 rows: the loss is 0), as
    Paddle does."""
    if reduction not in ("mean", "sum", "none"):
        raise ProgramError(f"cross_entropy: reduction must be mean, sum or none, got "
                           f"{reduction!r}")
    loss = softmax_with_cross_entropy(input, label, soft_label, ignore_index, axis)
    if reduction == "none":
        return loss
    if reduction == "mean" and soft_label:
        return mean(loss)
    total = _op("reduce_sum", {"X": [loss]}, {"reduce_all": True})
    if reduction == "sum":
        return total
    ignored = _constant([1], label.dtype, ignore_index)
    kept = cast(_op("not_equal", {"X": [label], "Y": [ignored]}), loss.dtype)
    count = maximum(_op("reduce_sum", {"X": [kept]}, {"reduce_all": True}),
                    _constant([1], loss.dtype, 1.0))
    count.stop_gradient = True
    return divide(total, count)


def _constant(shape: list[int], dtype: Any, value: float) -> Variable:
    out = _op("fill_constant", {}, {"shape": shape, "dtype": np.dtype(dtype).name,
                                    "value": float(value)})
    out.stop_gradient = True
    return out


def mean(x: Variable, name: str | None = None) -> Variable:
    """The mean of all elements, shape [1] (``reduce_mean`` with reduce_all)."""
    return _op("reduce_mean", {"X": [x]}, {"reduce_all": True}, name=name)


def _reduce(type: str, x: Variable, dim, keep_dim: bool, name: str | None) -> Variable:
    dims = [] if dim is None else [int(dim)] if isinstance(dim, int) else [int(d) for d in dim]
    attrs = {"dim": dims, "keep_dim": bool(keep_dim), "reduce_all": not dims}
    return _op(type, {"X": [x]}, attrs, name=name)


def reduce_sum(x: Variable, dim=None, keep_dim: bool = False, name: str | None = None):
    return _reduce("reduce_sum", x, dim, keep_dim, name)


def reduce_mean(x: Variable, dim=None, keep_dim: bool = False, name: str | None = None):
    return _reduce("reduce_mean", x, dim, keep_dim, name)


# arithmetic ----------------------------------------------------------------------------------
def matmul(x: Variable, y: Variable, transpose_x: bool = False, transpose_y: bool = False,
           name: str | None = None) -> Variable:
    attrs = {"trans_x": bool(transpose_x), "trans_y": bool(transpose_y)}
    return _op("matmul_v2", {"X": [x], "Y": [y]}, attrs, name=name)


def _binary(type: str):
    def layer(x: Variable, y: Variable, axis: int = -1, name: str | None = None) -> Variable:
        return _op(type, {"X": [x], "Y": [y]}, {"axis": int(axis)}, name=name)

    layer.__name__ = type.removeprefix("elementwise_")
    layer.__doc__ = f"``{type}`` with Paddle broadcasting (``axis``: where Y lines up in X)."
    return layer


add = _binary("elementwise_add")
subtract = _binary("elementwise_sub")
multiply = _binary("elementwise_mul")
divide = _binary("elementwise_div")
maximum = _binary("elementwise_max")
minimum = _binary("elementwise_min")


def scale(x: Variable, scale: float = 1.0, bias: float = 0.0, bias_after_scale: bool = True,
          name: str | None = None) -> Variable:
    attrs = {"scale": float(scale), "bias": float(bias), "bias_after_scale": bias_after_scale}
    return _op("scale", {"X": [x]}, attrs, name=name)


def cast(x: Variable, dtype: Any) -> Variable:
    return _op("cast", {"X": [x]}, {"in_dtype": x.dtype, "out_dtype": np.dtype(dtype).name})


# shapes --------------------------------------------------------------------------------------
def reshape(x: Variable, shape: Sequence[int], name: str | None = None) -> Variable:
    """0 copies x's dim, -1 is inferred (``reshape2``)."""
    return _append("reshape2", {"X": [x]}, {"shape": [int(d) for d in shape]},
                   hidden=("XShape",), name=name)["Out"][0]


def transpose(x: Variable, perm: Sequence[int], name: str | None = None) -> Variable:
    return _append("transpose2", {"X": [x]}, {"axis": [int(a) for a in perm]},
                   hidden=("XShape",), name=name)["Out"][0]


def squeeze(x: Variable, axes: Sequence[int] = (), name: str | None = None) -> Variable:
    return _append("squeeze2", {"X": [x]}, {"axes": [int(a) for a in axes]},
                   hidden=("XShape",), name=name)["Out"][0]


def unsqueeze(x: Variable, axes: Sequence[int], name: str | None = None) -> Variable:
    return _append("unsqueeze2", {"X": [x]}, {"axes": [int(a) for a in axes]},
                   hidden=("XShape",), name=name)["Out"][0]


def concat(input: Sequence[Variable], axis: int = 0, name: str | None = None) -> Variable:
    return _op("concat", {"X": list(input)}, {"axis": int(axis)}, name=name)


def split(x: Variable, num_or_sections, axis: int = 0, name: str | None = None) -> list[Variable]:
    """Equal pieces (an int) or pieces of the given sizes (one may be -1)."""
    if isinstance(num_or_sections, int):
        attrs, n = {"num": num_or_sections, "sections": [], "axis": int(axis)}, num_or_sections
    else:
        sections = [int(s) for s in num_or_sections]
        attrs, n = {"num": 0, "sections": sections, "axis": int(axis)}, len(sections)
    return _append("split", {"X": [x]}, attrs, counts={"Out": n}, name=name)["Out"]


def slice(x: Variable, axes: Sequence[int], starts: Sequence[int], ends: Sequence[int],
          decrease_axis: Sequence[int] = (), name: str | None = None) -> Variable:
    attrs = {"axes": list(axes), "starts": list(starts), "ends": list(ends),
             "decrease_axis": list(decrease_axis)}
    return _op("slice", {"Input": [x]}, attrs, name=name)
