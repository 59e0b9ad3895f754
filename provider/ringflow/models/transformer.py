"""``transformer``: a small decoder-only transformer (pre-norm blocks) in Megatron's tensor-parallel
layout: a vocabulary-parallel token embedding, causal self-attention with its heads split
across the model-parallel ranks, a column/row-parallel MLP, and the vocabulary-parallel
cross-entropy. Synthetic data: sequences that follow a fixed random recurrence."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import nn
from ..distributed.parallel_layers import parallel_cross_entropy, split
from ..framework.layer_helper import ParamAttr, create_parameter, data
from ..framework.program import Variable
from ..initializer import Normal
from ..nn import _op
from .common import BuiltModel, batch_rng, check_divides, check_float_dtype, check_positive


def transformer(vocab_size: int = 512, seq_len: int = 32, hidden_size: int = 64,
                num_heads: int = 4, num_layers: int = 2, ffn_size: int | None = None,
                mp_degree: int = 1, dtype: Any = "float32", dropout: float = 0.0,
                name: str = "gpt") -> BuiltModel:
    """Builds into the default main and startup programs (use ``program_guard``).

    Feeds ``tokens`` and ``labels``, int64 [-1, seq_len]; the loss is the mean next-token
    cross-entropy. Parameters: ``<name>.embed.tok`` [vocab, hidden] (split by rows),
    ``<name>.embed.pos`` [seq_len, hidden], per layer i ``<name>.<i>.ln1|ln2.scale|bias``,
    ``<name>.<i>.attn.qkv.w`` [hidden, 3 hidden] (column parallel, no bias; the columns of
    head h are its q, k and v, so a column slice holds whole heads at any degree),
    ``<name>.<i>.attn.out.w|b`` (row parallel), ``<name>.<i>.mlp.fc1|fc2.w|b``, then
    ``<name>.ln_f.scale|bias`` and ``<name>.head.w`` [hidden, vocab] (column parallel).
    Each layer's output (after its second residual add) is a recompute checkpoint."""
    ffn_size = 4 * hidden_size if ffn_size is None else ffn_size
    check_positive("transformer", vocab_size=vocab_size, seq_len=seq_len,
                   hidden_size=hidden_size, num_heads=num_heads, num_layers=num_layers,
                   ffn_size=ffn_size, mp_degree=mp_degree)
    check_divides("transformer", "num_heads", num_heads, hidden_size=hidden_size)
    check_divides("transformer", "mp_degree", mp_degree, num_heads=num_heads, vocab_size=vocab_size,
                  ffn_size=ffn_size)
    dtype = check_float_dtype("transformer", dtype)
    cfg = dict(vocab_size=vocab_size, seq_len=seq_len, hidden_size=hidden_size,
               num_heads=num_heads, num_layers=num_layers, ffn_size=ffn_size,
               mp_degree=mp_degree, dtype=dtype, dropout=dropout)
    tokens = data("tokens", [-1, seq_len], "int64")
    labels = data("labels", [-1, seq_len], "int64")
    init = Normal(0.0, 0.02)
    h = split(tokens, (vocab_size, hidden_size), "embedding", num_partitions=mp_degree,
              weight_attr=ParamAttr(f"{name}.embed.tok", initializer=init), dtype=dtype)
    pos = create_parameter([seq_len, hidden_size], dtype,
                           attr=ParamAttr(f"{name}.embed.pos", initializer=init))
    h = nn.add(h, pos)
    mask = _causal_mask(seq_len, dtype)
    checkpoints = []
    for i in range(num_layers):
        h = nn.add(h, _attention(_norm(h, f"{name}.{i}.ln1"), mask, cfg, f"{name}.{i}.attn"))
        h = nn.add(h, _mlp(_norm(h, f"{name}.{i}.ln2"), cfg, f"{name}.{i}.mlp"))
        checkpoints.append(h.name)
    h = _norm(h, f"{name}.ln_f")
    logits = split(h, (hidden_size, vocab_size), "linear", axis=1, num_partitions=mp_degree,
                   gather_out=False, weight_attr=ParamAttr(f"{name}.head.w", initializer=init),
                   bias_attr=False)
    logits = nn.reshape(logits, [-1, vocab_size // mp_degree])
    rows = parallel_cross_entropy(logits, nn.reshape(labels, [-1, 1]),
                                  num_partitions=mp_degree)
    loss = nn.mean(rows)
    return BuiltModel(loss, ["tokens", "labels"], _recurrence_batches(vocab_size, seq_len), cfg,
                      checkpoints, {"sample_loss": rows.name, "logits": logits.name})


def _norm(x: Variable, name: str) -> Variable:
    return nn.layer_norm(x, begin_norm_axis=2, weight_attr=ParamAttr(f"{name}.scale"),
                         bias_attr=ParamAttr(f"{name}.bias"))


def _causal_mask(seq_len: int, dtype: str) -> Variable:
    """[T, T]: 0 where a position may attend (itself and earlier), -1e9 above."""
    ones = _op("fill_constant", {}, {"shape": [seq_len, seq_len], "dtype": dtype,
                                     "value": 1.0})
    lower = _op("tril_triu", {"X": [ones]}, {"diagonal": 0, "lower": True})
    mask = nn.scale(lower, scale=1e9, bias=-1e9)
    for v in (ones, lower, mask):
        v.stop_gradient = True
    return mask


def _attention(x: Variable, mask: Variable, cfg: dict, name: str) -> Variable:
    d, heads, mp = cfg["hidden_size"], cfg["num_heads"], cfg["mp_degree"]
    local_heads, head_dim = heads // mp, d // heads
    # No bias: the key's would get an identically zero gradient (softmax ignores a shift of
    # a whole row of scores), so it would only collect rounding noise, which Adam amplifies.
    qkv = split(x, (d, 3 * d), "linear", axis=1, num_partitions=mp, gather_out=False,
                weight_attr=ParamAttr(f"{name}.qkv.w"), bias_attr=False)
    qkv = nn.reshape(qkv, [0, 0, local_heads, 3 * head_dim])
    q, k, v = (nn.transpose(t, [0, 2, 1, 3]) for t in nn.split(qkv, 3, axis=3))
    scores = nn.scale(nn.matmul(q, k, transpose_y=True), 1.0 / math.sqrt(head_dim))
    probs = nn.softmax(nn.add(scores, mask))
    if cfg["dropout"]:
        probs = nn.dropout(probs, cfg["dropout"])
    ctx = nn.reshape(nn.transpose(nn.matmul(probs, v), [0, 2, 1, 3]),
                     [0, 0, local_heads * head_dim])
    out = split(ctx, (d, d), "linear", axis=0, num_partitions=mp,
                weight_attr=ParamAttr(f"{name}.out.w"), bias_attr=ParamAttr(f"{name}.out.b"))
    return nn.dropout(out, cfg["dropout"]) if cfg["dropout"] else out


def _mlp(x: Variable, cfg: dict, name: str) -> Variable:
    d, ffn, mp = cfg["hidden_size"], cfg["ffn_size"], cfg["mp_degree"]
    h = split(x, (d, ffn), "linear", axis=1, num_partitions=mp, gather_out=False,
              weight_attr=ParamAttr(f"{name}.fc1.w"), bias_attr=ParamAttr(f"{name}.fc1.b"))
    h = nn.gelu(h, approximate=True)
    out = split(h, (ffn, d), "linear", axis=0, num_partitions=mp,
                weight_attr=ParamAttr(f"{name}.fc2.w"), bias_attr=ParamAttr(f"{name}.fc2.b"))
    return nn.dropout(out, cfg["dropout"]) if cfg["dropout"] else out


def _recurrence_batches(vocab_size: int, seq_len: int):
    def make_batch(seed: int, step: int, batch_size: int) -> dict[str, np.ndarray]:
        """Token t+1 = (a * token t + b) mod vocab, a and b fixed by the seed, the first
        token random per row; labels are the tokens one position ahead."""
        rule = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x6E47])
        a, b = int(rule.integers(1, vocab_size)) | 1, int(rule.integers(0, vocab_size))
        seqs = np.empty((batch_size, seq_len + 1), dtype=np.int64)
        seqs[:, 0] = batch_rng(seed, step).integers(0, vocab_size, batch_size)
        for t in range(seq_len):
            seqs[:, t + 1] = (a * seqs[:, t] + b) % vocab_size
        return {"tokens": seqs[:, :-1].copy(), "labels": seqs[:, 1:].copy()}

    return make_batch
