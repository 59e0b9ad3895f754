"""The table of op definitions: one registration per op type.

Each op registers its kernel, shape inference, attribute defaults and grad maker side by
side (``ops/*.py``). The IR checks slots against this table when an op is built, ``verify``
re-runs shape inference, ``append_backward`` asks the grad maker for grad ops, and the
executor looks kernels up here. It sits at the bottom of the package: it imports nothing
of ringflow but ``errors``.

Slots are written as strings: ``"X"`` one variable, ``"X*"`` a list of variables
(duplicable, like ``sum``'s inputs), ``"X?"`` optional, ``"X*?"`` both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import ProgramError

GRAD_SUFFIX = "@GRAD"
# Placeholder output name for a gradient nobody needs (an input in the no-grad set).
EMPTY_VAR_NAME = "@EMPTY@"


def grad_var_name(name: str) -> str:
    """The name of the gradient variable of ``name``: ``x`` -> ``x@GRAD``."""
    return name + GRAD_SUFFIX


def convert_dtype(dtype: Any) -> str:
    """Normalise a dtype given as str, numpy dtype or numpy type to its numpy name."""
    try:
        return np.dtype(dtype).name
    except TypeError as exc:
        raise ProgramError(f"unknown dtype {dtype!r}") from exc


@dataclasses.dataclass(frozen=True)
class Slot:
    name: str
    duplicable: bool = False
    optional: bool = False

    @classmethod
    def parse(cls, spec: str) -> Slot:
        name = spec.rstrip("*?")
        suffix = spec[len(name):]
        return cls(name, duplicable="*" in suffix, optional="?" in suffix)


@dataclasses.dataclass(frozen=True)
class OpDesc:
    """What a grad maker returns: an op to append, not yet in any block."""

    type: str
    inputs: dict[str, list[str]]
    outputs: dict[str, list[str]]
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


# grad maker: (forward op, names that need no gradient) -> grad op descs
GradMaker = Callable[[Any, frozenset], list[OpDesc]]


@dataclasses.dataclass(frozen=True)
class OpDef:
    type: str
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    attrs: Mapping[str, Any]
    kernel: Callable[[Any], None]
    infer_shape: Callable[[Any], None] | None = None
    grad: GradMaker | None = None

    def input_slot(self, name: str) -> Slot | None:
        return next((s for s in self.inputs if s.name == name), None)

    def output_slot(self, name: str) -> Slot | None:
        return next((s for s in self.outputs if s.name == name), None)


_REGISTRY: dict[str, OpDef] = {}


def register_op(
    type: str,
    *,
    inputs: Iterable[str],
    outputs: Iterable[str],
    attrs: Mapping[str, Any] | None = None,
    infer_shape: Callable[[Any], None] | None = None,
    grad: GradMaker | None = None,
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Decorator registering the decorated function as the kernel of op ``type``."""

    def wrap(kernel: Callable[[Any], None]) -> Callable[[Any], None]:
        if type in _REGISTRY:
            raise ProgramError(f"op type {type!r} is registered twice")
        _REGISTRY[type] = OpDef(
            type=type,
            inputs=tuple(Slot.parse(s) for s in inputs),
            outputs=tuple(Slot.parse(s) for s in outputs),
            attrs=dict(attrs or {}),
            kernel=kernel,
            infer_shape=infer_shape,
            grad=grad,
        )
        return kernel

    return wrap


def _unregister_op(type: str) -> None:
    """Remove an op type from the table (tests that register scratch ops clean up)."""
    _REGISTRY.pop(type, None)


def get_op_def(type: str) -> OpDef:
    _load_ops()
    try:
        return _REGISTRY[type]
    except KeyError:
        raise ProgramError(f"unknown op type {type!r}: no op of that type is registered") from None


def has_op_def(type: str) -> bool:
    _load_ops()
    return type in _REGISTRY


def registered_op_types() -> list[str]:
    _load_ops()
    return sorted(_REGISTRY)


def slot_errors(opdef: OpDef, inputs: Mapping[str, list[str]],
                outputs: Mapping[str, list[str]]) -> list[str]:
    """What is wrong with an op's slots against its definition (empty list: nothing):
    unknown slots, several variables in a one-variable slot, required slots missing."""
    errors = []
    for kind, given, slots in (("input", inputs, opdef.inputs), ("output", outputs, opdef.outputs)):
        known = {s.name: s for s in slots}
        for slot, names in given.items():
            if slot not in known:
                errors.append(f"unknown {kind} slot {slot!r}; {opdef.type} has {kind}s "
                              f"{sorted(known)}")
            elif len(names) > 1 and not known[slot].duplicable:
                errors.append(f"{kind} slot {slot!r} takes one variable, got {len(names)}: "
                              f"{list(names)}")
        errors += [f"required {kind} slot {s.name!r} is missing"
                   for s in slots if not s.optional and not given.get(s.name)]
    return errors


def _load_ops() -> None:
    # The op modules register themselves on import; importing them here (lazily, to avoid
    # an import cycle with the IR) makes the table complete whoever asks first.
    from .. import ops  # noqa: F401


class ShapeContext:
    """What shape inference sees: input shapes and dtypes, attrs; it sets output metas.

    Shapes are tuples with -1 for an unknown (batch) dimension.
    """

    def __init__(self, op, block) -> None:
        self.op = op
        self._block = block
        self.results: dict[str, list[tuple[tuple[int, ...], str] | None]] = {}

    def has_input(self, slot: str) -> bool:
        return bool(self.op.inputs.get(slot))

    def input_names(self, slot: str) -> list[str]:
        return list(self.op.inputs.get(slot, ()))

    def input_shape(self, slot: str, i: int = 0) -> tuple[int, ...]:
        return tuple(self._block._find_var_recursive(self.op.inputs[slot][i]).shape)

    def input_dtype(self, slot: str, i: int = 0) -> str:
        return self._block._find_var_recursive(self.op.inputs[slot][i]).dtype

    def input_shapes(self, slot: str) -> list[tuple[int, ...]]:
        return [self.input_shape(slot, i) for i in range(len(self.op.inputs.get(slot, ())))]

    def attr(self, name: str) -> Any:
        return self.op.attr(name)

    def set_output(self, slot: str, shape: Iterable[int], dtype: Any, i: int = 0) -> None:
        entries = self.results.setdefault(slot, [None] * len(self.op.outputs.get(slot, ())))
        if i < len(entries):
            entries[i] = (tuple(int(d) for d in shape), convert_dtype(dtype))


def same_shape_as(in_slot: str = "X", out_slot: str = "Out") -> Callable[[ShapeContext], None]:
    """Shape inference for ops whose output has the shape and dtype of one input."""

    def infer(ctx: ShapeContext) -> None:
        ctx.set_output(out_slot, ctx.input_shape(in_slot), ctx.input_dtype(in_slot))

    return infer


def make_grad_op(
    grad_type: str,
    *,
    fwd_inputs: Iterable[str] = (),
    fwd_outputs: Iterable[str] = (),
    out_grads: Iterable[str] = ("Out",),
    in_grads: Iterable[str] = ("X",),
    attrs: Mapping[str, Any] | None = None,
) -> GradMaker:
    """The usual grad maker (Paddle's default grad op maker, with chosen inputs).

    The grad op reads the named forward inputs and outputs and the gradients of
    ``out_grads`` (slots ``<slot>@GRAD``) and writes the gradients of ``in_grads``.
    Inputs in the no-grad set get ``EMPTY_VAR_NAME``; if none needs a gradient, no op.
    """
    fwd_inputs, fwd_outputs = tuple(fwd_inputs), tuple(fwd_outputs)
    out_grads, in_grads = tuple(out_grads), tuple(in_grads)

    def maker(op, no_grad: frozenset) -> list[OpDesc]:
        outputs = {}
        for slot in in_grads:
            names = op.inputs.get(slot, [])
            if names:
                outputs[slot + GRAD_SUFFIX] = [
                    EMPTY_VAR_NAME if n in no_grad else grad_var_name(n) for n in names
                ]
        if all(n == EMPTY_VAR_NAME for names in outputs.values() for n in names):
            return []
        inputs = {s: list(op.inputs[s]) for s in fwd_inputs if op.inputs.get(s)}
        inputs.update({s: list(op.outputs[s]) for s in fwd_outputs if op.outputs.get(s)})
        for slot in out_grads:
            inputs[slot + GRAD_SUFFIX] = [grad_var_name(n) for n in op.outputs[slot]]
        grad_attrs = {k: v for k, v in op.attrs.items() if k not in ("op_role", "op_role_var")}
        grad_attrs.update(attrs or {})
        return [OpDesc(grad_type, inputs, outputs, grad_attrs)]

    return maker
