"""Shape ops: reshape2, transpose2, squeeze2, unsqueeze2 (with Paddle's XShape), concat,
split, slice, tril_triu. Outputs are views of their input where numpy allows; gradients likewise."""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError
from ..framework.registry import OpDesc, grad_var_name, make_grad_op, register_op
from ._shapes import like_inputs, norm_axis, same_dtype


def _xshape(x: np.ndarray) -> np.ndarray:
    # Paddle's XShape: [0, *X.shape]; with its 0 the array holds no data, only the shape
    return np.empty((0, *x.shape), x.dtype)


def _xshape_grad_maker(grad_type: str):
    """Grad ops of XShape ops read XShape (or X when XShape is not bound) for X's shape."""

    def maker(op, no_grad: frozenset) -> list[OpDesc]:
        x = op.inputs["X"][0]
        if x in no_grad:
            return []
        xshape = op.outputs.get("XShape")
        inputs = {"XShape": list(xshape)} if xshape else {"X": [x]}
        inputs["Out@GRAD"] = [grad_var_name(op.outputs["Out"][0])]
        attrs = {k: v for k, v in op.attrs.items() if k not in ("op_role", "op_role_var")}
        return [OpDesc(grad_type, inputs, {"X@GRAD": [grad_var_name(x)]}, attrs)]

    return maker


def _x_shape(ctx) -> tuple[int, ...]:
    """X's shape in a grad op of an XShape op."""
    if ctx.has_input("XShape"):
        return ctx.input("XShape").shape[1:]
    return ctx.input("X").shape


def _infer_x_grad(ctx) -> None:
    if ctx.has_input("XShape"):
        ctx.set_output("X@GRAD", ctx.input_shape("XShape")[1:], ctx.input_dtype("Out@GRAD"))
    else:
        ctx.set_output("X@GRAD", ctx.input_shape("X"), ctx.input_dtype("Out@GRAD"))


def _register_xshape_op(type: str, attrs: dict, out_shape, grad_kernel=None):
    """Registers ``type`` (X -> Out, XShape?) whose Out has ``out_shape(x_shape, attr)`` and
    the grad ``<type>_grad`` (XShape or X, Out@GRAD -> X@GRAD; default kernel: dOut in X's
    shape); returns the decorator for the forward kernel."""

    def infer(ctx) -> None:
        shape = ctx.input_shape("X")
        ctx.set_output("Out", out_shape(shape, ctx.attr, f"op {type!r}"), ctx.input_dtype("X"))
        ctx.set_output("XShape", (0, *shape), ctx.input_dtype("X"))

    register_op(f"{type}_grad", inputs=["XShape?", "X?", "Out@GRAD"], outputs=["X@GRAD"],
                attrs=attrs, infer_shape=_infer_x_grad)(grad_kernel or _reshape_back)
    return register_op(type, inputs=["X"], outputs=["Out", "XShape?"], attrs=attrs,
                       infer_shape=infer, grad=_xshape_grad_maker(f"{type}_grad"))


def _reshape_back(ctx) -> None:
    # reshape2, squeeze2, unsqueeze2: the gradient is dOut in X's shape (a view)
    ctx.set_output("X@GRAD", ctx.input("Out@GRAD").reshape(_x_shape(ctx)))


def _set_out(ctx, x: np.ndarray, out: np.ndarray) -> None:
    ctx.set_output("Out", out)
    if ctx.has_output("XShape"):
        ctx.set_output("XShape", _xshape(x))


# reshape2: shape attr with 0 = copy X's dim, -1 = inferred --------------------------------
def reshape_target(x_shape, shape, where: str) -> tuple[int, ...]:
    shape = [int(d) for d in shape]
    if shape.count(-1) > 1:
        raise ProgramError(f"{where}: shape {shape} has more than one -1")
    out, copied = [], set()       # copied: positions taking an unknown dim of X as is
    for i, d in enumerate(shape):
        if d == 0:
            if i >= len(x_shape):
                raise ProgramError(f"{where}: shape {shape} copies dim {i} (0) but X has "
                                   f"{len(x_shape)} dims")
            d = x_shape[i]
            if d == -1:
                copied.add(i)
        out.append(d)
    known_x = int(np.prod([d for d in x_shape if d != -1]))
    if -1 not in shape:
        if -1 not in x_shape and int(np.prod(out)) != known_x:
            raise ProgramError(f"{where}: cannot reshape {list(x_shape)} to {shape}")
        return tuple(out)
    if list(x_shape).count(-1) > len(copied):
        return tuple(out)          # an unknown dim of X flows into the -1: it stays unknown
    infer = shape.index(-1)
    rest = int(np.prod([d for i, d in enumerate(out) if i != infer and i not in copied]))
    if rest == 0 or known_x % rest:
        raise ProgramError(f"{where}: cannot reshape {list(x_shape)} to {shape}")
    out[infer] = known_x // rest
    return tuple(out)


@_register_xshape_op("reshape2", {"shape": []},
                     lambda s, attr, where: reshape_target(s, attr("shape"), where))
def _reshape2(ctx) -> None:
    x = ctx.input("X")
    where = f"op {ctx.index} (reshape2)"
    _set_out(ctx, x, x.reshape(reshape_target(x.shape, ctx.attr("shape"), where)))


# squeeze2 / unsqueeze2 ---------------------------------------------------------------------
def _squeezed(shape, attr, where: str) -> tuple[int, ...]:
    axes = {norm_axis(int(a), len(shape)) for a in attr("axes") or []}
    if not axes:
        return tuple(d for d in shape if d != 1)
    # like Paddle, a named axis whose dim is not 1 stays
    return tuple(d for i, d in enumerate(shape) if i not in axes or d != 1)


def _unsqueezed(shape, attr, where: str) -> tuple[int, ...]:
    out = list(shape)
    for a in attr("axes") or []:
        a = int(a)
        out.insert(a + len(out) + 1 if a < 0 else a, 1)
    return tuple(out)


@_register_xshape_op("squeeze2", {"axes": []}, _squeezed)
def _squeeze2(ctx) -> None:
    x = ctx.input("X")
    _set_out(ctx, x, x.reshape(_squeezed(x.shape, ctx.attr, "")))


@_register_xshape_op("unsqueeze2", {"axes": []}, _unsqueezed)
def _unsqueeze2(ctx) -> None:
    x = ctx.input("X")
    _set_out(ctx, x, x.reshape(_unsqueezed(x.shape, ctx.attr, "")))


# transpose2: Out = X permuted by axis; dX = dOut permuted back -----------------------------
def _perm(ndim: int, axis, where: str) -> list[int]:
    perm = [int(a) % ndim if ndim else 0 for a in axis]
    if sorted(perm) != list(range(ndim)):
        raise ProgramError(f"{where}: axis {list(axis)} is not a permutation of {ndim} dims")
    return perm


def _transposed(shape, attr, where: str) -> tuple[int, ...]:
    return tuple(shape[a] for a in _perm(len(shape), attr("axis"), where))


def _transpose2_grad(ctx) -> None:
    dout = ctx.input("Out@GRAD")
    perm = _perm(dout.ndim, ctx.attr("axis"), f"op {ctx.index} (transpose2_grad)")
    ctx.set_output("X@GRAD", np.transpose(dout, np.argsort(perm)))


@_register_xshape_op("transpose2", {"axis": []}, _transposed, _transpose2_grad)
def _transpose2(ctx) -> None:
    x = ctx.input("X")
    _set_out(ctx, x, np.transpose(x, _perm(x.ndim, ctx.attr("axis"), f"op {ctx.index}")))


# concat: Out = X[0], X[1], ... joined along axis; dX[i] = the matching slice of dOut ------
def _infer_concat(ctx) -> None:
    shapes = ctx.input_shapes("X")
    axis = norm_axis(int(ctx.attr("axis")), len(shapes[0]), ctx)
    out = list(shapes[0])
    for s in shapes[1:]:
        if len(s) != len(out) or any(
                i != axis and -1 not in (a, b) and a != b for i, (a, b) in enumerate(zip(s, out))):
            raise ProgramError(f"op 'concat': inputs {[list(t) for t in shapes]} differ "
                               f"outside axis {axis}")
    dims = [s[axis] for s in shapes]
    out[axis] = -1 if -1 in dims else sum(dims)
    ctx.set_output("Out", out, same_dtype(ctx, "X"))


@register_op("concat", inputs=["X*"], outputs=["Out"], attrs={"axis": 0},
             infer_shape=_infer_concat, grad=make_grad_op("concat_grad", fwd_inputs=["X"]))
def _concat(ctx) -> None:
    xs = ctx.inputs("X")
    axis = norm_axis(int(ctx.attr("axis")), xs[0].ndim)
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = ctx.buffer("Out", tuple(shape), xs[0].dtype)
    np.concatenate(xs, axis=axis, out=out)
    ctx.set_output("Out", out)


def _pieces(a: np.ndarray, sizes, axis: int) -> list[np.ndarray]:
    """Views of ``a`` cut along ``axis`` into pieces of the given sizes."""
    return np.split(a, np.cumsum(sizes)[:-1], axis=axis)


@register_op("concat_grad", inputs=["X*", "Out@GRAD"], outputs=["X@GRAD*?"],
             attrs={"axis": 0}, infer_shape=like_inputs(("X", "X@GRAD")))
def _concat_grad(ctx) -> None:
    xs = ctx.inputs("X")
    axis = norm_axis(int(ctx.attr("axis")), xs[0].ndim)
    ctx.set_outputs("X@GRAD", _pieces(ctx.input("Out@GRAD"), [x.shape[axis] for x in xs], axis))


# split: X cut along axis into `num` equal pieces or `sections` (one may be -1) -------------
def split_sizes(dim: int, num: int, sections, where: str) -> list[int]:
    sections = [int(s) for s in sections or []]
    if sections:
        if sections.count(-1) > 1:
            raise ProgramError(f"{where}: sections {sections} has more than one -1")
        if -1 in sections and dim != -1:
            sections[sections.index(-1)] = dim - (sum(sections) + 1)
        if dim != -1 and -1 not in sections and sum(sections) != dim:
            raise ProgramError(f"{where}: sections {sections} do not add up to dim {dim}")
        return sections
    if num <= 0:
        raise ProgramError(f"{where}: give num > 0 or sections")
    if dim != -1 and dim % num:
        raise ProgramError(f"{where}: dim {dim} does not split into {num} equal pieces")
    return [dim // num if dim != -1 else -1] * num


def _split_grad(op, no_grad: frozenset) -> list[OpDesc]:
    x = op.inputs["X"][0]
    if x in no_grad:
        return []
    # dX is the output gradients joined back; an output nobody used needs a zero gradient
    # (fill_zeros_like) from the backward pass, as in Paddle
    return [OpDesc("concat", {"X": [grad_var_name(n) for n in op.outputs["Out"]]},
                   {"Out": [grad_var_name(x)]}, {"axis": int(op.attr("axis"))})]


def _infer_split(ctx) -> None:
    shape = ctx.input_shape("X")
    axis = norm_axis(int(ctx.attr("axis")), len(shape), ctx)
    sizes = split_sizes(shape[axis], int(ctx.attr("num")), ctx.attr("sections"), "op 'split'")
    if len(sizes) != len(ctx.op.outputs.get("Out", ())):
        raise ProgramError(f"op 'split': {len(sizes)} pieces but "
                           f"{len(ctx.op.outputs.get('Out', ()))} outputs")
    for i, size in enumerate(sizes):
        ctx.set_output("Out", [*shape[:axis], size, *shape[axis + 1:]], ctx.input_dtype("X"), i)


@register_op("split", inputs=["X"], outputs=["Out*"], attrs={"num": 0, "sections": [], "axis": 0},
             infer_shape=_infer_split, grad=_split_grad)
def _split(ctx) -> None:
    x = ctx.input("X")
    axis = norm_axis(int(ctx.attr("axis")), x.ndim)
    sizes = split_sizes(x.shape[axis], int(ctx.attr("num")), ctx.attr("sections"),
                        f"op {ctx.index} (split)")
    ctx.set_outputs("Out", _pieces(x, sizes, axis))


# slice: Input[starts:ends] along axes (python rules, clamped); decrease_axis drops dims ----
_SLICE_ATTRS = {"axes": [], "starts": [], "ends": [], "decrease_axis": [], "infer_flags": []}


def _slices(shape, attr) -> tuple[slice, ...]:
    index = [slice(None)] * len(shape)
    for a, s, e in zip(attr("axes"), attr("starts"), attr("ends")):
        index[norm_axis(int(a), len(shape))] = slice(int(s), int(e))
    return tuple(index)


def _sliced_shape(shape, attr, keep_dims: bool = False) -> tuple[int, ...]:
    out = [d if d == -1 else len(range(*sl.indices(d)))
           for d, sl in zip(shape, _slices(shape, attr))]
    if keep_dims:
        return tuple(out)
    drop = {norm_axis(int(a), len(shape)) for a in attr("decrease_axis") or []}
    return tuple(d for i, d in enumerate(out) if i not in drop) or (1,)


def _infer_slice(ctx) -> None:
    ctx.set_output("Out", _sliced_shape(ctx.input_shape("Input"), ctx.attr),
                   ctx.input_dtype("Input"))


@register_op("slice", inputs=["Input"], outputs=["Out"], attrs=_SLICE_ATTRS,
             infer_shape=_infer_slice,
             grad=make_grad_op("slice_grad", fwd_inputs=["Input"], in_grads=["Input"]))
def _slice(ctx) -> None:
    x = ctx.input("Input")
    ctx.set_output("Out", x[_slices(x.shape, ctx.attr)].reshape(_sliced_shape(x.shape, ctx.attr)))


@register_op("slice_grad", inputs=["Input", "Out@GRAD"], outputs=["Input@GRAD"],
             attrs=_SLICE_ATTRS, infer_shape=like_inputs(("Input", "Input@GRAD")))
def _slice_grad(ctx) -> None:
    x, dout = ctx.input("Input"), ctx.input("Out@GRAD")
    dx = ctx.buffer("Input@GRAD", x.shape, dout.dtype)
    dx.fill(0)
    dx[_slices(x.shape, ctx.attr)] = dout.reshape(_sliced_shape(x.shape, ctx.attr, True))
    ctx.set_output("Input@GRAD", dx)


# tril_triu: the lower (or upper) triangle of the last two dims, the rest zero ---------------
_TRIL_ATTRS = {"diagonal": 0, "lower": True}


def _triangle(x: np.ndarray, diagonal: int, lower: bool) -> np.ndarray:
    if x.ndim < 2:
        raise ValueError(f"tril_triu needs at least 2 dims, got shape {list(x.shape)}")
    return np.tril(x, diagonal) if lower else np.triu(x, diagonal)


@register_op("tril_triu", inputs=["X"], outputs=["Out"], attrs=_TRIL_ATTRS,
             infer_shape=like_inputs(("X", "Out")),
             grad=make_grad_op("tril_triu_grad", in_grads=["X"]))
def _tril_triu(ctx) -> None:
    ctx.set_output("Out", _triangle(ctx.input("X"), int(ctx.attr("diagonal")),
                                    bool(ctx.attr("lower"))))


@register_op("tril_triu_grad", inputs=["Out@GRAD"], outputs=["X@GRAD"], attrs=_TRIL_ATTRS,
             infer_shape=like_inputs(("Out@GRAD", "X@GRAD")))
def _tril_triu_grad(ctx) -> None:
    ctx.set_output("X@GRAD", _triangle(ctx.input("Out@GRAD"), int(ctx.attr("diagonal")),
                                       bool(ctx.attr("lower"))))
