"""The IR's plain records: ``Variable`` (a named tensor slot), ``Parameter`` (a trainable,
persistable variable) and ``Operator`` (type, slots -> variable names, attrs).

They hold data and answer Paddle's accessors; ``Block`` (program.py) creates and mutates them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .registry import EMPTY_VAR_NAME, convert_dtype

if TYPE_CHECKING:
    from .program import Block


class Variable:
    """A named tensor slot of a block: shape (-1 for batch), dtype, flags."""

    def __init__(
        self,
        block: Block,
        name: str,
        shape: Iterable[int] | None = None,
        dtype: Any = "float32",
        persistable: bool = False,
        stop_gradient: bool = False,
        is_data: bool = False,
    ) -> None:
        self.block = block
        self.name = name
        self.shape = tuple(int(d) for d in shape) if shape is not None else None
        self.dtype = convert_dtype(dtype)
        self.persistable = persistable
        self.stop_gradient = stop_gradient
        self.is_data = is_data

    @property
    def ndim(self) -> int:
        return len(self.shape or ())

    def __repr__(self) -> str:
        from .printer import var_to_string

        return var_to_string(self)


class Parameter(Variable):
    """A persistable, trainable variable initialised by the startup program."""

    def __init__(
        self,
        block: Block,
        name: str,
        shape: Iterable[int],
        dtype: Any = "float32",
        trainable: bool = True,
        initializer: Any = None,
        is_distributed: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(block, name, shape, dtype, persistable=True,
                         stop_gradient=not trainable, **kwargs)
        self.trainable = trainable
        self.initializer = initializer
        self.is_distributed = is_distributed
        # Which axis a tensor-parallel shard was cut along (None: not split).
        self.split_axis: int | None = None
        # Per-parameter learning-rate multiplier, as Paddle's ParamAttr.learning_rate.
        self.optimize_attr = {"learning_rate": 1.0}
        # ParamAttr's need_clip (gradient clipping applies) and regularizer (None: the
        # optimizer's weight_decay applies), as Paddle's Parameter carries them.
        self.need_clip = True
        self.regularizer = None


def _names(args: Any) -> list[str]:
    if args is None:
        return []
    if isinstance(args, (Variable, str)):
        args = [args]
    return [a.name if isinstance(a, Variable) else str(a) for a in args]


class Operator:
    """One op: type, input and output slots (slot -> list of var names), attrs."""

    def __init__(
        self,
        block: Block,
        type: str,
        inputs: dict[str, list[str]],
        outputs: dict[str, list[str]],
        attrs: dict[str, Any],
    ) -> None:
        self.block = block
        self.type = type
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs

    # Paddle's accessors -------------------------------------------------------------------
    def attr(self, name: str) -> Any:
        return self.attrs.get(name)

    def has_attr(self, name: str) -> bool:
        return name in self.attrs

    def _set_attr(self, name: str, value: Any) -> None:
        self.attrs[name] = value

    @property
    def attr_names(self) -> list[str]:
        return list(self.attrs)

    def input(self, slot: str) -> list[str]:
        return list(self.inputs.get(slot, []))

    def output(self, slot: str) -> list[str]:
        return list(self.outputs.get(slot, []))

    @property
    def input_names(self) -> list[str]:
        return list(self.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.outputs)

    @property
    def input_arg_names(self) -> list[str]:
        return [n for names in self.inputs.values() for n in names]

    @property
    def output_arg_names(self) -> list[str]:
        return [n for names in self.outputs.values() for n in names if n != EMPTY_VAR_NAME]

    def __repr__(self) -> str:
        from .printer import op_to_string

        return op_to_string(self)
