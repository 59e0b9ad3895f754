"""What layer functions build on: ``data`` inputs, ``ParamAttr`` and ``create_parameter``,
which puts a parameter into the default main program and its initializer into the default
startup program, as Paddle's LayerHelper does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..errors import ProgramError
from .program import Block, Parameter, Variable, default_main_program, default_startup_program
from .records import Shard
from .registry import convert_dtype


class ParamAttr:
    """How to create a parameter: its name (None: a unique ``<layer>.w_0``/``.b_0``), its
    initializer, a learning-rate multiplier, whether it is trained, clipped, regularised."""

    def __init__(self, name: str | None = None, initializer: Any = None,
                 learning_rate: float = 1.0, trainable: bool = True, regularizer: Any = None,
                 need_clip: bool = True) -> None:
        self.name = name
        self.initializer = initializer
        self.learning_rate = float(learning_rate)
        self.trainable = bool(trainable)
        self.regularizer = regularizer
        self.need_clip = bool(need_clip)

    @staticmethod
    def _to_attr(arg: Any) -> ParamAttr | bool:
        """Paddle's shorthands: None -> defaults, a str -> the name, an Initializer -> the
        initializer, False -> no parameter at all (``bias_attr=False``)."""
        from ..initializer import Initializer

        if arg is None or arg is True:
            return ParamAttr()
        if arg is False or isinstance(arg, ParamAttr):
            return arg
        if isinstance(arg, str):
            return ParamAttr(name=arg)
        if isinstance(arg, Initializer):
            return ParamAttr(initializer=arg)
        raise ProgramError(f"a parameter attribute must be a ParamAttr, a name, an Initializer, "
                           f"None or False; got {type(arg).__name__} {arg!r}")

    def __repr__(self) -> str:
        return (f"ParamAttr(name={self.name!r}, initializer={self.initializer!r}, "
                f"learning_rate={self.learning_rate}, trainable={self.trainable})")


def data(name: str, shape: Iterable[int | None], dtype: Any = "float32",
         lod_level: int = 0) -> Variable:
    """An input of the default main program, fed by ``Executor.run(feed=...)``: -1 (or
    None) marks a dimension of any size, usually the batch."""
    dims = [-1 if d is None else int(d) for d in shape]
    if any(d < -1 or d == 0 for d in dims):
        raise ProgramError(f"data {name!r}: dimensions must be positive or -1, got {dims}")
    block = default_main_program().global_block()
    existing = block.vars.get(name)
    if existing is not None:
        if existing.is_data and existing.shape == tuple(dims) \
                and existing.dtype == convert_dtype(dtype):
            return existing
        raise ProgramError(f"data {name!r}: the program already has {existing!r}")
    return block.create_var(name=name, shape=dims, dtype=dtype, is_data=True,
                            stop_gradient=True)


_PARAM_NAME = re.compile(r"_(\d+)\.([wb])_\d+\Z")


def _generated_name(block: Block, prefix: str, is_bias: bool) -> str:
    """``<prefix>_<k>.w_0`` for a weight (k: a new layer) or ``.b_0`` for a bias (k: the
    newest layer of this prefix, if it has no bias yet), as Paddle names fc_0.w_0, fc_0.b_0.

    Derived from the block's parameters, so a clone or a second build of the same model
    gives the same names (and so the same initial values)."""
    layers: dict[int, set[str]] = {}
    for name in block.vars:
        m = _PARAM_NAME.search(name)
        if m and name[: m.start()] == prefix:
            layers.setdefault(int(m.group(1)), set()).add(m.group(2))
    newest = max(layers, default=-1)
    if is_bias and newest >= 0 and "b" not in layers[newest]:
        k = newest
    else:
        k = newest + 1
    return f"{prefix}_{k}.{'b' if is_bias else 'w'}_0"


def _named_in_layer(block: Block, layer_name: str, is_bias: bool) -> str:
    kind = "b" if is_bias else "w"
    j = 0
    while f"{layer_name}.{kind}_{j}" in block.vars:
        j += 1
    return f"{layer_name}.{kind}_{j}"


def create_parameter(shape: Iterable[int], dtype: Any = "float32", attr: Any = None,
                     is_bias: bool = False, default_initializer: Any = None,
                     prefix: str = "fc", layer_name: str | None = None,
                     shard: Shard | None = None) -> Parameter | None:
    """A parameter of the default main program, initialised by the default startup program.

    Named ``attr.name``, else ``<layer_name>.w_<j>`` when a layer name is given (``fc(...,
    name=...)``), else generated from ``prefix`` (``fc_0.w_0``, ``fc_0.b_0``). Initialised
    by ``attr.initializer``, else ``default_initializer``, else XavierUniform (weights) or
    Constant(0.0) (biases). A name already in the program returns that parameter (shared
    weights). ``attr=False`` creates nothing and returns None.

    ``shard``: the parameter is this process's tensor-parallel piece of a larger one
    (``shape`` is the piece's); it is marked ``is_distributed`` and its initializer draws the
    whole parameter and keeps the piece, so the piece is bitwise the slice of what a serial
    model's parameter of the same name gets.
    """
    from ..initializer import Constant, XavierUniform

    attr = ParamAttr._to_attr(attr)
    if attr is False:
        return None
    shape = [int(d) for d in shape]
    main = default_main_program().global_block()
    startup = default_startup_program().global_block()
    if attr.name:
        name = attr.name
    elif layer_name:
        name = _named_in_layer(main, layer_name, is_bias)
    else:
        name = _generated_name(main, prefix, is_bias)
    if any(d <= 0 for d in shape):
        raise ProgramError(f"parameter {name!r}: shape {shape} must be fully known and positive")
    if shard is not None and tuple(shape) != shard.shape:
        raise ProgramError(f"parameter {name!r}: shape {shape} is not the shard shape "
                           f"{list(shard.shape)} of {list(shard.full_shape)}")
    existing = main.vars.get(name)
    if existing is not None:
        return _shared(existing, shape, dtype, shard)
    init = attr.initializer or default_initializer or (
        Constant(0.0) if is_bias else XavierUniform())
    param = _new_parameter(main, name, shape, dtype, attr, init, shard)
    if name not in startup.vars:
        init(_new_parameter(startup, name, shape, dtype, attr, init, shard), startup)
    return param


def _new_parameter(block: Block, name: str, shape: list[int], dtype: Any, attr: ParamAttr,
                   init: Any, shard: Shard | None) -> Parameter:
    p = block.create_parameter(name, shape, dtype, trainable=attr.trainable, initializer=init)
    p.optimize_attr["learning_rate"] = attr.learning_rate
    p.need_clip = attr.need_clip
    p.regularizer = attr.regularizer
    if shard is not None:
        p.shard, p.split_axis, p.is_distributed = shard, shard.axis, True
    return p


def _shared(existing: Variable, shape: list[int], dtype: Any,
            shard: Shard | None) -> Parameter:
    if not isinstance(existing, Parameter):
        raise ProgramError(f"cannot create parameter {existing.name!r}: the program has a "
                           f"variable of that name that is not a parameter")
    if list(existing.shape) != shape or existing.dtype != convert_dtype(dtype):
        raise ProgramError(f"parameter {existing.name!r} exists as {existing.dtype}"
                           f"{list(existing.shape)}; cannot reuse it as "
                           f"{convert_dtype(dtype)}{shape}")
    if existing.shard != shard:
        raise ProgramError(f"parameter {existing.name!r} exists as shard {existing.shard}; "
                           f"cannot reuse it as shard {shard}")
    return existing
