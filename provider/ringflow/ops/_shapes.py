"""Shape inference shared by the op families: grads shaped like forward vars, Paddle's
elementwise broadcasting with unknown (-1) dims, normalised axes, one dtype for inputs."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ProgramError


def _where(ctx) -> str:
    return f"op {ctx.op.type!r}"


def known_shape(ctx, slot: str, i: int = 0) -> tuple[int, ...] | None:
    """The shape of input ``slot`` (None when the variable's shape is not known yet)."""
    try:
        return ctx.input_shape(slot, i)
    except TypeError:
        return None


def like_inputs(*pairs: tuple[str, str]):
    """Shape inference setting each output slot to the shape and dtype of an input slot
    (``(in_slot, out_slot)`` pairs); used by grad ops: ``X@GRAD`` looks like ``X``."""

    def infer(ctx) -> None:
        for src, dst in pairs:
            for i in range(min(len(ctx.input_names(src)), len(ctx.op.outputs.get(dst, ())))):
                shape = known_shape(ctx, src, i)
                if shape is not None:
                    ctx.set_output(dst, shape, ctx.input_dtype(src, i), i)

    return infer


def same_dtype(ctx, *slots: str) -> str:
    """The one dtype of the variables in the given input slots; different dtypes fail the
    build, as in Paddle (numpy would silently promote float32 with float64 to float64)."""
    found = []
    for slot in slots:
        count = len(ctx.input_names(slot))
        for i in range(count):
            found.append((slot if count == 1 else f"{slot}[{i}]", ctx.input_dtype(slot, i)))
    if len({dtype for _, dtype in found}) > 1:
        shown = ", ".join(f"{name} is {dtype}" for name, dtype in found)
        raise ProgramError(f"{_where(ctx)}: inputs must have one dtype: {shown}")
    return found[0][1]


def norm_axis(axis: int, ndim: int, ctx=None) -> int:
    if not -ndim <= axis < max(ndim, 1):
        where = f"{_where(ctx)}: " if ctx is not None else ""
        raise ProgramError(f"{where}axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim if ndim else 0


def broadcast_dim(a: int, b: int, where: str) -> int:
    if a == 1:
        return b
    if b == 1 or a == b:
        return a
    if a == -1 or b == -1:
        return b if a == -1 else a
    raise ProgramError(f"{where}: dims {a} and {b} cannot be broadcast")


def aligned_y_shape(x_shape: Sequence[int], y_shape: Sequence[int], axis: int) -> tuple[int, ...]:
    """Paddle's elementwise rule: ``Y`` (fewer dims) lines up with ``X`` starting at dim
    ``axis`` (-1: trailing dims, as numpy). Returns Y's shape padded with 1s to X's rank."""
    x_shape, y_shape = tuple(x_shape), tuple(y_shape)
    if axis == -1 or len(y_shape) >= len(x_shape):
        return y_shape
    if not 0 <= axis <= len(x_shape) - len(y_shape):
        raise ProgramError(f"elementwise axis {axis} does not fit Y {list(y_shape)} into "
                           f"X {list(x_shape)}")
    return (1,) * axis + y_shape + (1,) * (len(x_shape) - axis - len(y_shape))


def broadcast_shapes(a: Sequence[int], b: Sequence[int], where: str) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(broadcast_dim(p, q, where) for p, q in zip(a, b))
