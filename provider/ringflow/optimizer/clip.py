"""Gradient clipping by global norm, computed by ops inside the program (role Optimize).

    sq_i   = squared_l2_norm(g_i)                      per gradient
    dist   = sum(sq_i of is_distributed params)        -> global_norm_sq_distributed_<k>
    repl   = sum(sq_i of the other params)             -> global_norm_sq_replicated_<k>
    norm   = sqrt(sum(dist, repl))
    scale  = clip_norm / max(norm, clip_norm)
    g_i    = g_i * scale                               in place, as Paddle

Tensor parallelism: a sharded (``is_distributed``) parameter holds a different slice on
every model-parallel rank, so its partial sum of squares must be all-reduced over the
model-parallel ring before the two partials are added; replicated parameters must not be
(they would count n times). That is why the two partial sums are separate variables: a
tensor-parallel pass inserts ``c_allreduce_sum`` (in place, on the model-parallel ring) right
after the op writing the variable named ``DIST_SQ_PREFIX + "_<k>"`` (``distributed_sq_ops``
finds it) and nothing else changes.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..framework.program import Block, Operator, Variable
from .optimizer import _free_name

DIST_SQ_PREFIX = "global_norm_sq_distributed"
REPL_SQ_PREFIX = "global_norm_sq_replicated"


class ClipGradByGlobalNorm:
    """``paddle.nn.ClipGradByGlobalNorm``: scale all gradients by
    clip_norm / max(global_norm, clip_norm), global_norm = sqrt(sum of all |g|^2).

    As in Paddle, a parameter made with ``ParamAttr(need_clip=False)`` is left out: its
    gradient neither counts towards the norm nor is scaled."""

    def __init__(self, clip_norm: float, group_name: str = "default_group",
                 auto_skip_clip: bool = False) -> None:
        if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) \
                or clip_norm <= 0:
            raise ConfigError(f"ClipGradByGlobalNorm: clip_norm must be a positive float, "
                              f"got {clip_norm!r}")
        self.clip_norm = float(clip_norm)
        self.group_name = group_name

    def __repr__(self) -> str:
        return f"ClipGradByGlobalNorm(clip_norm={self.clip_norm})"

    def __call__(self, params_grads):
        clipped = [(p, g) for p, g in params_grads if getattr(p, "need_clip", True)]
        if not clipped:
            return params_grads
        program = clipped[0][0].block.program
        block = program.global_block()
        dist, repl = [], []
        for p, g in clipped:
            with program._optimized_guard([p, g]):
                sq = _tmp(block, f"{g.name}_squared_l2_norm", g.dtype)
                block.append_op("squared_l2_norm", inputs={"X": g}, outputs={"Out": sq})
            (dist if getattr(p, "is_distributed", False) else repl).append(sq)
        with program._optimized_guard():
            scale = self._scale_var(block, dist, repl, clipped[0][1].dtype)
        for p, g in clipped:
            with program._optimized_guard([p, g]):
                block.append_op("elementwise_mul", inputs={"X": g, "Y": scale},
                                outputs={"Out": g})
        return params_grads

    def _scale_var(self, block: Block, dist: list[Variable], repl: list[Variable],
                   dtype: str) -> Variable:
        partials = []
        for prefix, squares in ((DIST_SQ_PREFIX, dist), (REPL_SQ_PREFIX, repl)):
            if squares:
                out = _tmp(block, prefix, dtype)
                block.append_op("sum", inputs={"X": squares}, outputs={"Out": out})
                partials.append(out)
        total = _tmp(block, "global_norm_sq", dtype)
        block.append_op("sum", inputs={"X": partials}, outputs={"Out": total})
        norm = _tmp(block, "global_norm", dtype)
        block.append_op("sqrt", inputs={"X": total}, outputs={"Out": norm})
        max_norm = _tmp(block, "clip_norm", dtype)
        block.append_op("fill_constant", outputs={"Out": max_norm},
                        attrs={"shape": [1], "dtype": dtype, "value": self.clip_norm})
        denom = _tmp(block, "global_norm_clipped", dtype)
        block.append_op("elementwise_max", inputs={"X": max_norm, "Y": norm},
                        outputs={"Out": denom})
        scale = _tmp(block, "global_norm_clip_scale", dtype)
        block.append_op("elementwise_div", inputs={"X": max_norm, "Y": denom},
                        outputs={"Out": scale})
        return scale


def _tmp(block: Block, base: str, dtype: str) -> Variable:
    return block.create_var(name=_free_name(block, base), shape=(1,), dtype=dtype,
                            stop_gradient=True)


def distributed_sq_ops(block: Block) -> list[tuple[int, Operator]]:
    """(index, op) of each op writing a distributed partial sum of squares: where a
    tensor-parallel pass inserts its all-reduce (right after)."""
    return [(i, op) for i, op in enumerate(block.ops)
            if any(n.startswith(DIST_SQ_PREFIX) for n in op.output_arg_names)]
