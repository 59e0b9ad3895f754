"""Ops that make tensors: fill_constant, uniform_random, gaussian_random (what the
initializers emit), assign and fill_zeros_like.

Random ops draw from ``np.random.default_rng(seed)`` with the op's ``seed`` attr (set by
the initializer from ``Program.random_seed``), so the same seed gives the same values in
every process; an op with seed 0 draws from the executor's per-op generator instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ExecutionError, ProgramError
from ..framework.registry import OpDesc, convert_dtype, grad_var_name, register_op, same_shape_as

# Paddle's VarType codes, for programs that carry the dtype attr as an int.
_PADDLE_DTYPES = {0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32",
                  6: "float64", 20: "uint8", 21: "int8"}


def attr_dtype(value: Any) -> str:
    """A dtype attr (numpy name, numpy dtype or Paddle's VarType int) as a numpy name."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) not in _PADDLE_DTYPES:
            raise ProgramError(f"unknown Paddle dtype code {value}")
        return _PADDLE_DTYPES[int(value)]
    return convert_dtype(value)


def _infer_from_attrs(ctx) -> None:
    ctx.set_output("Out", ctx.attr("shape"), attr_dtype(ctx.attr("dtype")))


def _shape_and_dtype(ctx) -> tuple[tuple[int, ...], str]:
    """The tensor a creation op makes: its shape attr (fully known) and dtype attr."""
    shape = tuple(int(d) for d in ctx.attr("shape"))
    if any(d < 0 for d in shape):
        raise ExecutionError(f"op {ctx.index} ({ctx.op.type}): shape attr {list(shape)} must be "
                             f"fully known (no -1) to create a tensor")
    return shape, attr_dtype(ctx.attr("dtype"))


@register_op("fill_constant", inputs=[], outputs=["Out"],
             attrs={"shape": [1], "dtype": "float32", "value": 0.0, "str_value": "",
                    "force_cpu": False},
             infer_shape=_infer_from_attrs)
def _fill_constant(ctx) -> None:
    shape, dtype = _shape_and_dtype(ctx)
    value = ctx.attr("str_value") or ctx.attr("value")
    # A fresh array (no ``buffer``): in a startup program Out is a parameter whose array a
    # user may have put into the scope; it is tiny when it is the loss gradient.
    ctx.set_output("Out", np.full(shape, float(value), dtype=dtype))


def _generator(ctx) -> np.random.Generator:
    seed = int(ctx.attr("seed") or 0)
    return np.random.default_rng(seed) if seed else ctx.rng()


# A tensor-parallel shard's init op: ``shape`` is the shard's, ``full_shape`` the whole
# parameter's (empty: not a shard), cut into equal parts along ``shard_axis``.
_SHARD_ATTRS = {"full_shape": [], "shard_axis": -1, "shard_index": 0}


def _draw(ctx, sample) -> np.ndarray:
    """``sample(generator, shape)`` drawn for the op's tensor. For a shard: drawn for the
    whole parameter (the same numbers a serial model's op draws), then this piece is kept as
    a contiguous copy and the whole freed, so a process holds one whole parameter at most."""
    shape, dtype = _shape_and_dtype(ctx)
    full = tuple(int(d) for d in ctx.attr("full_shape") or ())
    if not full:
        return sample(_generator(ctx), shape).astype(dtype)
    axis, index = int(ctx.attr("shard_axis")), int(ctx.attr("shard_index"))
    if len(full) != len(shape) or not 0 <= axis < len(full) or full[axis] % shape[axis] \
            or any(f != d for i, (f, d) in enumerate(zip(full, shape)) if i != axis) \
            or not 0 <= index < full[axis] // shape[axis]:
        raise ExecutionError(f"op {ctx.index} ({ctx.op.type}): shard {index} along axis "
                             f"{axis} of shape {list(shape)} does not fit full_shape "
                             f"{list(full)}")
    whole = sample(_generator(ctx), full)
    cut = [slice(None)] * len(full)
    cut[axis] = slice(index * shape[axis], (index + 1) * shape[axis])
    piece = np.ascontiguousarray(whole[tuple(cut)], dtype=dtype)
    del whole
    return piece


@register_op("uniform_random", inputs=[], outputs=["Out"],
             attrs={"shape": [1], "dtype": "float32", "min": -1.0, "max": 1.0, "seed": 0,
                    **_SHARD_ATTRS},
             infer_shape=_infer_from_attrs)
def _uniform_random(ctx) -> None:
    lo, hi = float(ctx.attr("min")), float(ctx.attr("max"))
    ctx.set_output("Out", _draw(ctx, lambda gen, shape: gen.uniform(lo, hi, shape)))


@register_op("gaussian_random", inputs=[], outputs=["Out"],
             attrs={"shape": [1], "dtype": "float32", "mean": 0.0, "std": 1.0, "seed": 0,
                    **_SHARD_ATTRS},
             infer_shape=_infer_from_attrs)
def _gaussian_random(ctx) -> None:
    mean, std = float(ctx.attr("mean")), float(ctx.attr("std"))
    ctx.set_output("Out", _draw(ctx, lambda gen, shape: gen.normal(mean, std, shape)))


def _assign_grad(op, no_grad: frozenset) -> list[OpDesc]:
    name = op.inputs["X"][0]
    if name in no_grad:
        return []
    return [OpDesc("assign", {"X": [grad_var_name(op.outputs["Out"][0])]},
                   {"Out": [grad_var_name(name)]})]


@register_op("assign", inputs=["X"], outputs=["Out"], infer_shape=same_shape_as("X", "Out"),
             grad=_assign_grad)
def _assign(ctx) -> None:
    # A copy, not the same array: Out may be updated in place (a parameter) while X lives on.
    ctx.set_output("Out", np.array(ctx.input("X"), copy=True))


@register_op("fill_zeros_like", inputs=["X"], outputs=["Out"],
             infer_shape=same_shape_as("X", "Out"))
def _fill_zeros_like(ctx) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", np.zeros(x.shape, x.dtype))
