"""Which ops compute in float16 (Paddle's ``AutoMixedPrecisionLists``, fp16_lists.py).

White: numerically safe and worth it (the GEMMs): always float16. Black: numerically
dangerous (exp, logs, reductions, softmax, cross entropy, normalisation): always float32.
Gray: float16 when fed by a white op, float32 when fed by a black one, else untouched.
Ops in no list compute in float32.

ringflow's differences from Paddle's lists: ``layer_norm`` is black (Paddle: gray, with
Scale, Bias, Mean and Variance kept float32; a CPU gains nothing from a float16
normalisation); ``gelu`` and the tensor-parallel pairs ``mp_allreduce_sum``, ``c_split`` and
``c_allgather`` are gray, so a split layer stays float16 as its serial twin does.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError

WHITE_LIST = frozenset({"conv2d", "matmul", "matmul_v2", "mul"})

BLACK_LIST = frozenset({
    "exp", "square", "log", "mean", "sum", "cos_sim", "softmax", "softmax_with_cross_entropy",
    "sigmoid_cross_entropy_with_logits", "c_softmax_with_cross_entropy", "cross_entropy",
    "cross_entropy2", "reduce_sum", "reduce_mean", "layer_norm",
    # Paddle's extra black list: float16 lookups are slower than float32 ones
    "lookup_table", "lookup_table_v2", "c_embedding", "scatter",
})

GRAY_LIST = frozenset({
    "elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div",
    "elementwise_max", "elementwise_min", "elementwise_pow", "batch_norm", "tanh", "sigmoid",
    "gelu", "pool2d", "dropout", "relu", "relu6", "leaky_relu", "flatten2", "stack",
    "unstack", "uniform_random", "gaussian_random", "slice", "scale", "transpose2",
    "reshape2", "squeeze2", "unsqueeze2", "gather", "fill_constant", "sign", "cast",
    "c_identity", "c_concat", "c_allreduce_sum", "mp_allreduce_sum", "c_split",
    "c_allgather", "concat", "split",
})


class AutoMixedPrecisionLists:
    """The three lists, with the user's custom white and black lists moved in: a custom
    white op leaves the black and gray lists, a custom black op the white and gray ones.
    An op in both custom lists is a ConfigError (Paddle: ValueError)."""

    def __init__(self, custom_white_list: Iterable[str] | None = None,
                 custom_black_list: Iterable[str] | None = None) -> None:
        white, black = set(custom_white_list or ()), set(custom_black_list or ())
        both = sorted(white & black)
        if both:
            raise ConfigError(f"amp: custom_white_list and custom_black_list both name "
                              f"{', '.join(both)}")
        self.white_list = (set(WHITE_LIST) - black) | white
        self.black_list = (set(BLACK_LIST) - white) | black
        self.gray_list = set(GRAY_LIST) - white - black

    def __repr__(self) -> str:
        return (f"AutoMixedPrecisionLists(white={sorted(self.white_list)}, "
                f"black={sorted(self.black_list)})")


CustomOpLists = AutoMixedPrecisionLists
