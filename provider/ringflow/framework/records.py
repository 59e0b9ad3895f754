"""The IR's plain records: ``Variable`` (a named tensor slot), ``Parameter`` (a trainable,
persistable variable) and ``Operator`` (type, slots -> variable names, attrs).

They hold data and answer Paddle's accessors; ``Block`` (program.py) creates and mutates them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import ProgramError
from .printer import op_to_string, var_to_string
from .registry import EMPTY_VAR_NAME, convert_dtype

if TYPE_CHECKING:
    from .program import Block


class Variable:
    """A named tensor slot of a block: shape (-1 for batch), dtype, flags."""

    is_parameter = False    # Parameter's is True (the printer reads it; no isinstance)

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

        return var_to_string(self)


@dataclasses.dataclass(frozen=True)
class Shard:
    """Where a tensor-parallel parameter's shard sits in the whole parameter: ``index`` of
    ``parts`` equal pieces of ``full_shape`` cut along ``axis``."""

    full_shape: tuple[int, ...]
    axis: int
    index: int
    parts: int

    def __post_init__(self) -> None:
        if not 0 <= self.axis < len(self.full_shape):
            raise ProgramError(f"shard axis {self.axis} is out of range for a parameter of "
                               f"shape {list(self.full_shape)}")
        if self.parts < 1 or not 0 <= self.index < self.parts \
                or self.full_shape[self.axis] % self.parts:
            raise ProgramError(f"cannot cut dim {self.axis} of shape {list(self.full_shape)} "
                               f"into {self.parts} equal parts and take part {self.index}")

    @property
    def shape(self) -> tuple[int, ...]:
        """The shard's own shape."""
        dims = list(self.full_shape)
        dims[self.axis] //= self.parts
        return tuple(dims)

    def slice_of(self, full):
        """This shard's part of an array shaped like the whole parameter."""
        size = self.full_shape[self.axis] // self.parts
        index = [slice(None)] * len(self.full_shape)
        index[self.axis] = slice(self.index * size, (self.index + 1) * size)
        return full[tuple(index)]


class Parameter(Variable):
    """A persistable, trainable variable initialised by the startup program."""

    is_parameter = True

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
        # Which axis a tensor-parallel shard was cut along (None: not split), and where the
        # shard sits in the whole parameter (initializers draw the whole, then slice).
        self.split_axis: int | None = None
        self.shard: Shard | None = None
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

    def _rename_input(self, old: str, new: str) -> None:
        for names in self.inputs.values():
            names[:] = [new if n == old else n for n in names]

    def _rename_output(self, old: str, new: str) -> None:
        for names in self.outputs.values():
            names[:] = [new if n == old else n for n in names]

    def _set_input(self, slot: str, names: list[str]) -> None:
        """Paddle's ``desc.set_input``: slot ``slot`` reads ``names``."""
        self.inputs[slot] = list(names)

    def _set_output(self, slot: str, names: list[str]) -> None:
        self.outputs[slot] = list(names)

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

        return op_to_string(self)
