"""``mlp``: blocks of a column-parallel linear, ReLU and a row-parallel linear (Megatron's
MLP), classifying synthetic points labelled by a fixed random linear teacher."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import nn
from ..distributed.parallel_layers import split
from ..framework.layer_helper import ParamAttr, data
from .common import BuiltModel, batch_rng, check_divides, check_float_dtype, check_positive


def mlp(input_size: int = 64, hidden_size: int = 256, num_classes: int = 10,
        num_layers: int = 1, mp_degree: int = 1, dtype: Any = "float32",
        dropout: float = 0.0, name: str = "mlp") -> BuiltModel:
    """Builds into the default main and startup programs (use ``program_guard``).

    Feeds ``x`` [-1, input_size] and ``y`` [-1] (int64 labels). Block i is
    ``<name>.<i>.fc1`` (column parallel, input -> hidden, split output), ReLU, then
    ``<name>.<i>.fc2`` (row parallel, hidden -> hidden, or -> num_classes in the last block,
    gathered); blocks are joined by ReLU, whose outputs are the recompute checkpoints.
    ``mp_degree=1`` builds plain serial layers."""
    check_positive("mlp", input_size=input_size, hidden_size=hidden_size,
                   num_classes=num_classes, num_layers=num_layers, mp_degree=mp_degree)
    check_divides("mlp", "mp_degree", mp_degree, hidden_size=hidden_size)
    dtype = check_float_dtype("mlp", dtype)
    x = data("x", [-1, input_size], dtype)
    y = data("y", [-1], "int64")
    h, width = x, input_size
    checkpoints = []
    for i in range(num_layers):
        out = num_classes if i == num_layers - 1 else hidden_size
        h = split(h, (width, hidden_size), "linear", axis=1, num_partitions=mp_degree,
                  gather_out=False, weight_attr=ParamAttr(f"{name}.{i}.fc1.w"),
                  bias_attr=ParamAttr(f"{name}.{i}.fc1.b"))
        h = nn.relu(h)
        if dropout:
            h = nn.dropout(h, dropout)
        h = split(h, (hidden_size, out), "linear", axis=0, num_partitions=mp_degree,
                  weight_attr=ParamAttr(f"{name}.{i}.fc2.w"),
                  bias_attr=ParamAttr(f"{name}.{i}.fc2.b"))
        if i < num_layers - 1:
            h = nn.relu(h)
            checkpoints.append(h.name)
        width = out
    rows = nn.softmax_with_cross_entropy(h, y)
    loss = nn.mean(rows)
    config = dict(input_size=input_size, hidden_size=hidden_size, num_classes=num_classes,
                  num_layers=num_layers, mp_degree=mp_degree, dtype=dtype, dropout=dropout)

    def make_batch(seed: int, step: int, batch_size: int) -> dict[str, np.ndarray]:
        teacher = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x7EAC]).standard_normal(
            (input_size, num_classes))
        xs = batch_rng(seed, step).standard_normal((batch_size, input_size))
        return {"x": xs.astype(dtype), "y": np.argmax(xs @ teacher, axis=1).astype(np.int64)}

    return BuiltModel(loss, ["x", "y"], make_batch, config, checkpoints,
                      {"sample_loss": rows.name, "logits": h.name, "labels": "y"})
