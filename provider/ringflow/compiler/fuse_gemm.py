"""The fuse_gemm_epilogue pass. A layer ``matmul_v2 -> elementwise_add(bias) [-> relu]`` in
the forward section becomes one ``fused_gemm_epilogue`` step, and its gradient
``[relu_grad ->] elementwise_add_grad -> matmul_v2_grad`` one ``fused_gemm_epilogue_grad``
step (ops/fused.py), when nothing else reads the values fusion does not produce: the
GEMM's output, the pre-activation and their gradients."""

from __future__ import annotations

from dataclasses import dataclass

from ..framework.program import Operator
from ..framework.registry import EMPTY_VAR_NAME, get_op_def
from ..framework.roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole
from .steps import Step, readers_of, writers_of

# What TensorParallelOptimizer puts between a layer's grad ops (per-gradient all-reduces of
# the bias gradient): they only touch that gradient, so the fused grad step may go first.
_MOVABLE = frozenset({"c_sync_calc_stream", "c_allreduce_sum", "c_sync_comm_stream"})


@dataclass
class _Layer:
    forward: list[int]            # step positions: matmul, add[, relu]
    backward: list[int]           # step positions: [relu_grad,] add_grad, matmul_grad
    fused_forward: Step
    fused_backward: Step | None
    hidden: set[str]


class _Graph:
    """The steps with who reads and writes each variable, and the names not to fuse away."""

    def __init__(self, steps: list[Step], block, keep: frozenset[str]) -> None:
        self.steps, self.block, self.keep = steps, block, keep
        self.readers, self.writers = readers_of(steps), writers_of(steps)

    def op(self, pos: int) -> Operator | None:
        return self.steps[pos].op if 0 <= pos < len(self.steps) else None

    def only(self, table: dict[str, list[int]], name: str) -> int | None:
        found = table.get(name, [])
        return found[0] if len(found) == 1 else None

    def shape(self, name: str):
        var = self.block._find_var_recursive(name)
        return None if var is None or var.shape is None else tuple(var.shape)


def fuse(steps: list[Step], block, keep: frozenset[str]) -> tuple[list[Step], frozenset[str]]:
    """The steps with every fusable layer fused; returns them and the hidden names."""
    graph = _Graph(steps, block, keep)
    layers, taken = [], set()
    for pos, step in enumerate(steps):
        if step.op.type == "matmul_v2" and pos not in taken:
            layer = _layer(graph, pos)
            if layer is not None and not taken & {*layer.forward, *layer.backward}:
                layers.append(layer)
                taken.update(layer.forward, layer.backward)
    if not layers:
        return steps, frozenset()
    at = {layer.forward[0]: layer.fused_forward for layer in layers}
    at.update({layer.backward[0]: layer.fused_backward for layer in layers if layer.backward})
    out = [at.get(pos, step) for pos, step in enumerate(steps) if pos in at or pos not in taken]
    return out, frozenset(name for layer in layers for name in layer.hidden)


def _layer(g: _Graph, pos: int) -> _Layer | None:
    mm, add = g.op(pos), g.op(pos + 1)
    mm_out = mm.output("Out")[0]
    if add is None or add.type != "elementwise_add" or add.input("X") != [mm_out]:
        return None
    bias, add_out = add.input("Y")[0], add.output("Out")[0]
    if not _bias_fits(g, mm_out, bias, add.attr("axis")):
        return None
    act = g.op(pos + 2)
    relu = act is not None and act.type == "relu" and act.input("X") == [add_out]
    out = act.output("Out")[0] if relu else add_out
    forward = [pos, pos + 1] + ([pos + 2] if relu else [])
    hidden = {mm_out, add_out} if relu else {mm_out}
    backward, fused_backward = [], None
    grad_readers = [r for r in g.readers.get(mm_out, []) if r not in forward]
    if grad_readers:
        found = _backward(g, grad_readers, mm, add, relu, out)
        if found is None:
            return None
        backward, fused_backward, more_hidden = found
        hidden |= more_hidden
    allowed = {*forward, *backward}
    if hidden & g.keep or any(r not in allowed for n in hidden for r in g.readers.get(n, [])):
        return None
    fused = Operator(g.block, "fused_gemm_epilogue",
                     {"X": mm.input("X"), "Y": mm.input("Y"), "Bias": [bias]}, {"Out": [out]},
                     {"trans_x": bool(mm.attr("trans_x")), "trans_y": bool(mm.attr("trans_y")),
                      "activation": "relu" if relu else "none", "axis": add.attr("axis"),
                      OP_ROLE_KEY: mm.attr(OP_ROLE_KEY) or 0})
    step = Step(fused, get_op_def(fused.type).kernel, pos, tuple(forward))
    return _Layer(forward, backward, step, fused_backward, hidden)


def _bias_fits(g: _Graph, mm_out: str, bias: str, axis) -> bool:
    """A bias along the GEMM output's last dim, so adding it does not change the shape."""
    out, b = g.shape(mm_out), g.shape(bias)
    if out is None or b is None or len(b) != 1 or not out:
        return False
    axis = -1 if axis is None else int(axis)
    return b[0] == out[-1] and b[0] != -1 and axis in (-1, len(out) - 1)


def _backward(g: _Graph, grad_readers: list[int], mm: Operator, add: Operator, relu: bool,
              out: str) -> tuple[list[int], Step, set[str]] | None:
    """The layer's grad ops, if they are the plain chain fusion can stand for."""
    if len(grad_readers) != 1:
        return None
    ga_pos = grad_readers[0]
    ga = g.op(ga_pos)
    if ga.type != "elementwise_add_grad" or ga.input("Y") != add.input("Y"):
        return None
    add_grad, mm_grad = ga.input("Out@GRAD")[0], (ga.output("X@GRAD") or [EMPTY_VAR_NAME])[0]
    gm_pos = g.only(g.readers, mm_grad) if mm_grad != EMPTY_VAR_NAME else None
    gm = g.op(gm_pos) if gm_pos is not None else None
    if (gm is None or gm.type != "matmul_v2_grad" or gm.input("Out@GRAD") != [mm_grad]
            or gm.input("X") != mm.input("X") or gm.input("Y") != mm.input("Y")
            or bool(gm.attr("trans_x")) != bool(mm.attr("trans_x"))
            or bool(gm.attr("trans_y")) != bool(mm.attr("trans_y"))):
        return None
    chain, dout, hidden = [ga_pos, gm_pos], add_grad, {mm_grad}
    if relu:
        act_pos = g.only(g.writers, add_grad)
        act = g.op(act_pos) if act_pos is not None else None
        if act is None or act.type != "relu_grad" or act.input("Out") != [out]:
            return None
        chain, dout, hidden = [act_pos, *chain], act.input("Out@GRAD")[0], hidden | {add_grad}
    if chain != sorted(chain) or not _only_movable_between(g, chain, hidden | {dout}):
        return None
    if g.readers.get(add_grad) != [ga_pos] or g.readers.get(mm_grad) != [gm_pos]:
        return None
    fused = Operator(g.block, "fused_gemm_epilogue_grad",
                     {"X": mm.input("X"), "Y": mm.input("Y"), "Bias": add.input("Y"),
                      **({"Out": [out]} if relu else {}), "Out@GRAD": [dout]},
                     {"X@GRAD": gm.output("X@GRAD"), "Y@GRAD": gm.output("Y@GRAD"),
                      "Bias@GRAD": ga.output("Y@GRAD")},
                     {"trans_x": bool(mm.attr("trans_x")), "trans_y": bool(mm.attr("trans_y")),
                      "activation": "relu" if relu else "none", "axis": add.attr("axis"),
                      "inplace_grad": relu and _own_alone(g, dout, chain[0]),
                      OP_ROLE_KEY: int(OpRole.Backward),
                      OP_ROLE_VAR_KEY: [*(ga.attr(OP_ROLE_VAR_KEY) or []),
                                        *(gm.attr(OP_ROLE_VAR_KEY) or [])]})
    return chain, Step(fused, get_op_def(fused.type).kernel, chain[0], tuple(chain)), hidden


def _only_movable_between(g: _Graph, chain: list[int], names: set[str]) -> bool:
    for pos in range(chain[0] + 1, chain[-1]):
        if pos in chain:
            continue
        op = g.op(pos)
        if op.type not in _MOVABLE or names & {*op.input_arg_names, *op.output_arg_names}:
            return False
    return True


def _own_alone(g: _Graph, dout: str, reader: int) -> bool:
    """dOut may take the ReLU's gradient in place: only the layer reads it, nobody fetches
    it, and it is not state that outlives the step."""
    var = g.block._find_var_recursive(dout)
    return (g.readers.get(dout) == [reader] and dout not in g.keep
            and not (var is not None and var.persistable))
