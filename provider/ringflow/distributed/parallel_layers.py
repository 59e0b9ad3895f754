"""Tensor-parallel layers of the static graph, as Paddle's ``paddle.distributed.split`` and
``ParallelCrossEntropy`` (reference paddle-semantics.md 4.2-4.4): linear layers cut by
columns or rows, a vocabulary-parallel embedding and the cross-entropy over vocabulary-
sharded logits. Their collective ops run on ring 0, the model-parallel ring that
``TensorParallelOptimizer`` creates.

A process's piece of a weight is a parameter with the whole weight's name, marked
``is_distributed``, whose initializer draws the whole weight and keeps the piece (so every
degree starts from the serial model's values). With ``num_partitions=1`` the layers are the
plain serial ones and emit no collective op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, ProgramError
from ..framework.layer_helper import create_parameter
from ..framework.program import Variable
from ..framework.records import Shard
from ..nn import _append, _op, embedding, softmax_with_cross_entropy

__all__ = ["parallel_cross_entropy", "split"]

MP_RING_ID = 0  # Paddle's split and TensorParallelOptimizer agree on ring 0


def _mp_rank(num_partitions: int, what: str) -> int:
    """This process's rank inside its model-parallel group of ``num_partitions`` ranks
    (global rank mod degree, as Paddle's ``inner_rank``). Needs ``fleet.init``; a degree
    the strategy given to ``fleet.init`` disagrees with is a ConfigError naming both."""
    from . import fleet

    if not fleet.is_initialized():
        raise ConfigError(f"{what}: call ringflow.distributed.fleet.init(is_collective=True) "
                          f"before building tensor-parallel layers (num_partitions="
                          f"{num_partitions})")
    strategy = fleet.get_strategy()
    degree = strategy._mp_degree() if strategy is not None else None
    if degree is not None and degree != num_partitions:
        raise ConfigError(f"{what}: num_partitions={num_partitions} differs from the "
                          f"strategy's tensor_parallel_degree={degree}")
    world = fleet.worker_num()
    if world % num_partitions:
        raise ConfigError(f"{what}: num_partitions={num_partitions} does not divide the "
                          f"world size {world}")
    return fleet.worker_index() % num_partitions


def _check_size(size: Sequence[int], operation: str) -> tuple[int, int]:
    if len(size) != 2 or any(int(d) <= 0 for d in size):
        raise ProgramError(f"split: size must be two positive ints (the {operation} weight's "
                           f"shape), got {list(size)}")
    return int(size[0]), int(size[1])


def _divisible(dim: int, n: int, what: str) -> int:
    if dim % n:
        raise ProgramError(f"split: {what} {dim} is not divisible by num_partitions={n}")
    return dim // n


def split(x: Variable, size: Sequence[int], operation: str, axis: int = 0,
          num_partitions: int = 1, gather_out: bool = True, weight_attr: Any = None,
          bias_attr: Any = None, name: str | None = None, *,
          dtype: Any = "float32") -> Variable:
    """Paddle's ``paddle.distributed.split`` for static programs (``dtype``, ringflow's
    addition, is the embedding table's; linear weights take ``x``'s dtype).

    - ``operation="linear", axis=1`` (column parallel): weight [in, out/n]; ``c_identity``
      (its backward all-reduces the input's gradient), local matmul, this rank's bias piece;
      ``gather_out`` concatenates the pieces (``c_concat``), else the output stays split.
    - ``operation="linear", axis=0`` (row parallel): weight [in/n, out]; ``c_split`` first
      when ``x`` is whole (its last dim is ``in``), local matmul; ``gather_out`` sums the
      partial products (``mp_allreduce_sum``) and adds the whole bias; without it the
      partial product is returned and no bias is added, as Paddle.
    - ``operation="embedding", axis=0`` (vocabulary parallel): table [vocab/n, dim],
      ``c_embedding`` (ids outside this rank's rows give zeros) then ``mp_allreduce_sum``.
    """
    in_dim, out_dim = _check_size(size, operation)
    n = int(num_partitions)
    if n < 1:
        raise ConfigError(f"split: num_partitions must be >= 1, got {num_partitions}")
    if operation == "embedding":
        if axis != 0:
            raise ProgramError(f"split: an embedding is split along axis 0 only, got {axis}")
        return _vocab_parallel_embedding(x, in_dim, out_dim, n, weight_attr, name, dtype)
    if operation != "linear":
        raise ProgramError(f"split: operation must be 'linear' or 'embedding', got "
                           f"{operation!r}")
    if axis not in (0, 1):
        raise ProgramError(f"split: a linear layer is split along axis 0 (rows) or 1 "
                           f"(columns), got {axis}")
    if n == 1:
        return _linear(x, in_dim, out_dim, weight_attr, bias_attr, name)
    rank = _mp_rank(n, "split")
    if axis == 1:
        return _column_parallel(x, in_dim, out_dim, n, rank, gather_out, weight_attr,
                                bias_attr, name)
    return _row_parallel(x, in_dim, out_dim, n, rank, gather_out, weight_attr, bias_attr,
                         name)


def _mp_attrs(n: int, rank: int) -> dict[str, Any]:
    return {"ring_id": MP_RING_ID, "rank": rank, "nranks": n, "use_calc_stream": True,
            "use_model_parallel": True}


def _comm_attrs() -> dict[str, Any]:
    return {"ring_id": MP_RING_ID, "use_calc_stream": True, "use_model_parallel": True}


def _linear(x: Variable, in_dim: int, out_dim: int, weight_attr: Any, bias_attr: Any,
            name: str | None) -> Variable:
    """The serial layer (one partition): the parameters get the names a split layer's get."""
    w = create_parameter([in_dim, out_dim], x.dtype, attr=weight_attr, prefix="linear",
                         layer_name=name)
    y = _op("matmul_v2", {"X": [x], "Y": [w]}, name=name)
    b = create_parameter([out_dim], x.dtype, attr=bias_attr, is_bias=True, prefix="linear",
                         layer_name=name)
    if b is not None:
        y = _op("elementwise_add", {"X": [y], "Y": [b]}, {"axis": -1}, name=name)
    return y


def _column_parallel(x: Variable, in_dim: int, out_dim: int, n: int, rank: int,
                     gather_out: bool, weight_attr: Any, bias_attr: Any,
                     name: str | None) -> Variable:
    local = _divisible(out_dim, n, "the output size (size[1])")
    w = create_parameter([in_dim, local], x.dtype, attr=weight_attr, prefix="linear",
                         layer_name=name, shard=Shard((in_dim, out_dim), 1, rank, n))
    x_in = _op("c_identity", {"X": [x]}, _comm_attrs(), name=name)
    y = _op("matmul_v2", {"X": [x_in], "Y": [w]}, name=name)
    b = create_parameter([local], x.dtype, attr=bias_attr, is_bias=True, prefix="linear",
                         layer_name=name, shard=Shard((out_dim,), 0, rank, n))
    if b is not None:
        y = _op("elementwise_add", {"X": [y], "Y": [b]}, {"axis": -1}, name=name)
    if gather_out:
        y = _op("c_concat", {"X": [y]}, _mp_attrs(n, rank), name=name)
    return y


def _row_parallel(x: Variable, in_dim: int, out_dim: int, n: int, rank: int,
                  gather_out: bool, weight_attr: Any, bias_attr: Any,
                  name: str | None) -> Variable:
    local = _divisible(in_dim, n, "the input size (size[0])")
    w = create_parameter([local, out_dim], x.dtype, attr=weight_attr, prefix="linear",
                         layer_name=name, shard=Shard((in_dim, out_dim), 0, rank, n))
    last = x.shape[-1] if x.shape else -1
    if last == in_dim:
        x = _op("c_split", {"X": [x]}, _mp_attrs(n, rank), name=name)
    elif last != local:
        raise ProgramError(f"split: row-parallel input {x.name!r} has last dim {last}; "
                           f"expected the whole {in_dim} or this rank's {local}")
    y = _op("matmul_v2", {"X": [x], "Y": [w]}, name=name)
    if not gather_out:
        return y
    y = _op("mp_allreduce_sum", {"X": [y]}, _comm_attrs(), name=name)
    b = create_parameter([out_dim], x.dtype, attr=bias_attr, is_bias=True, prefix="linear",
                         layer_name=name)
    if b is not None:
        y = _op("elementwise_add", {"X": [y], "Y": [b]}, {"axis": -1}, name=name)
    return y


def _vocab_parallel_embedding(ids: Variable, vocab: int, dim: int, n: int, weight_attr: Any,
                              name: str | None, dtype: Any) -> Variable:
    if n == 1:
        return embedding(ids, (vocab, dim), weight_attr=weight_attr, dtype=dtype, name=name)
    rank = _mp_rank(n, "split")
    rows = _divisible(vocab, n, "the vocabulary size (size[0])")
    w = create_parameter([rows, dim], dtype, attr=weight_attr, prefix="embedding",
                         layer_name=name, shard=Shard((vocab, dim), 0, rank, n))
    out = _op("c_embedding", {"W": [w], "Ids": [ids]},
              {"start_index": rank * rows, "vocab_size": vocab}, name=name)
    return _op("mp_allreduce_sum", {"X": [out]}, _comm_attrs(), name=name)


def parallel_cross_entropy(logits: Variable, label: Variable, ignore_index: int = -100,
                           num_partitions: int | None = None,
                           name: str | None = None) -> Variable:
    """Per-row softmax cross-entropy [N..., 1] of logits whose last axis (the vocabulary)
    is split over the model-parallel group (``c_softmax_with_cross_entropy``), as Paddle's
    ``ParallelCrossEntropy``. Labels are int64 of shape [N...] or [N..., 1].

    ``num_partitions`` defaults to the degree of the strategy given to ``fleet.init``; with
    1 this is the plain ``softmax_with_cross_entropy``."""
    n = num_partitions
    if n is None:
        n = _strategy_degree()
    if logits.shape is not None and label.shape is not None:
        if len(label.shape) == len(logits.shape) - 1:
            label = _op("unsqueeze2", {"X": [label]}, {"axes": [-1]})
        elif len(label.shape) != len(logits.shape):
            raise ProgramError(f"parallel_cross_entropy: label {label.name!r} "
                               f"{list(label.shape)} must have the rank of logits "
                               f"{list(logits.shape)} or one less")
    if n == 1:
        return softmax_with_cross_entropy(logits, label, ignore_index=ignore_index)
    rank = _mp_rank(n, "parallel_cross_entropy")
    attrs = {"ring_id": MP_RING_ID, "rank": rank, "nranks": n,
             "ignore_index": int(ignore_index)}
    outs = _append("c_softmax_with_cross_entropy", {"Logits": [logits], "Label": [label]},
                   attrs, outputs=("Softmax", "Loss"), name=name)
    return outs["Loss"][0]


def _strategy_degree() -> int:
    from . import fleet

    strategy = fleet.get_strategy() if fleet.is_initialized() else None
    degree = strategy._mp_degree() if strategy is not None else None
    if degree is None:
        raise ConfigError("parallel_cross_entropy: pass num_partitions, or give fleet.init a "
                          "strategy with tensor_parallel on")
    return degree
