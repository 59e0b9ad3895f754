"""rf.distributed.split and parallel_cross_entropy: the ops and sharded parameters Paddle's
static split makes (reference paddle-semantics.md 4.4), and their errors. Programs are built,
not run (the parity tests run them)."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.errors import ConfigError, ProgramError
from ringflow.framework.records import Shard


def _world(world: int, rank: int, monkeypatch, strategy=None) -> None:
    for name, value in {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world),
                        "PADDLE_TRAINER_ENDPOINTS": ",".join(
                            f"127.0.0.1:{7000 + r}" for r in range(world)),
                        "PADDLE_TRAINING_ROLE": "TRAINER"}.items():
        monkeypatch.setenv(name, value)
    fleet.init(is_collective=True, strategy=strategy)


def _ops(main) -> list[str]:
    return [op.type for op in main.global_block().ops]


def _layer(fn):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        out = fn()
    return main, startup, out


def test_column_parallel_linear_is_identity_matmul_sharded_bias_and_concat(monkeypatch):
    _world(4, 3, monkeypatch)        # mp rank 1 of 2
    main, _, out = _layer(lambda: rf.distributed.split(
        rf.data("x", [-1, 6]), (6, 8), "linear", axis=1, num_partitions=2,
        weight_attr="w", bias_attr="b"))
    assert _ops(main) == ["c_identity", "matmul_v2", "elementwise_add", "c_concat"]
    block = main.global_block()
    w, b = block.var("w"), block.var("b")
    assert (w.shape, w.is_distributed, w.split_axis, w.shard) == (
        (6, 4), True, 1, Shard((6, 8), 1, 1, 2))
    assert (b.shape, b.is_distributed, b.shard) == ((4,), True, Shard((8,), 0, 1, 2))
    concat = block.ops[-1]
    assert (concat.attr("ring_id"), concat.attr("rank"), concat.attr("nranks")) == (0, 1, 2)
    assert out.shape == (-1, 8)


def test_column_parallel_without_gather_keeps_the_split_output(monkeypatch):
    _world(2, 0, monkeypatch)
    main, _, out = _layer(lambda: rf.distributed.split(
        rf.data("x", [-1, 6]), (6, 8), "linear", axis=1, num_partitions=2,
        gather_out=False, bias_attr=False))
    assert _ops(main) == ["c_identity", "matmul_v2"]
    assert out.shape == (-1, 4)


def test_row_parallel_linear_splits_a_whole_input_then_sums_then_adds_the_whole_bias(
        monkeypatch):
    _world(2, 1, monkeypatch)
    main, startup, out = _layer(lambda: rf.distributed.split(
        rf.data("x", [-1, 6]), (6, 8), "linear", axis=0, num_partitions=2,
        weight_attr="w", bias_attr="b"))
    assert _ops(main) == ["c_split", "matmul_v2", "mp_allreduce_sum", "elementwise_add"]
    block = main.global_block()
    assert block.var("w").shard == Shard((6, 8), 0, 1, 2)
    assert (block.var("b").shape, block.var("b").is_distributed) == ((8,), False)
    assert startup.global_block().var("b").is_distributed is False
    assert out.shape == (-1, 8)


def test_row_parallel_on_an_already_split_input_does_not_split_again(monkeypatch):
    _world(2, 0, monkeypatch)
    main, _, _ = _layer(lambda: rf.distributed.split(
        rf.data("x", [-1, 3]), (6, 8), "linear", axis=0, num_partitions=2))
    assert _ops(main) == ["matmul_v2", "mp_allreduce_sum", "elementwise_add"]


def test_row_parallel_without_gather_returns_the_partial_product_and_no_bias(monkeypatch):
    _world(2, 0, monkeypatch)
    main, _, _ = _layer(lambda: rf.distributed.split(
        rf.data("x", [-1, 3]), (6, 8), "linear", axis=0, num_partitions=2,
        gather_out=False))
    assert _ops(main) == ["matmul_v2"]
    assert [p.name for p in main.all_parameters()] == ["linear_0.w_0"]


def test_vocab_parallel_embedding_looks_up_its_rows_then_sums(monkeypatch):
    _world(2, 1, monkeypatch)
    main, _, out = _layer(lambda: rf.distributed.split(
        rf.data("ids", [-1, 5], "int64"), (10, 4), "embedding", num_partitions=2,
        weight_attr="emb", dtype="float64"))
    assert _ops(main) == ["c_embedding", "mp_allreduce_sum"]
    emb = main.global_block().var("emb")
    assert (emb.shape, emb.dtype, emb.shard) == ((5, 4), "float64", Shard((10, 4), 0, 1, 2))
    lookup = main.global_block().ops[0]
    assert (lookup.attr("start_index"), lookup.attr("vocab_size")) == (5, 10)
    assert out.shape == (-1, 5, 4)


def test_one_partition_builds_the_serial_layers_with_the_same_parameter_names():
    main, _, _ = _layer(lambda: rf.distributed.split(
        rf.nn.relu(rf.distributed.split(rf.data("x", [-1, 6]), (6, 8), "linear", axis=1)),
        (8, 2), "linear", axis=0))
    assert _ops(main) == ["matmul_v2", "elementwise_add", "relu", "matmul_v2",
                          "elementwise_add"]
    assert [p.name for p in main.all_parameters()] == [
        "linear_0.w_0", "linear_0.b_0", "linear_1.w_0", "linear_1.b_0"]
    assert not any(p.is_distributed for p in main.all_parameters())


def test_parallel_cross_entropy_over_sharded_logits(monkeypatch):
    _world(2, 1, monkeypatch)
    main, _, loss = _layer(lambda: rf.distributed.parallel_cross_entropy(
        rf.data("logits", [-1, 5]), rf.data("label", [-1], "int64"), num_partitions=2))
    assert _ops(main) == ["unsqueeze2", "c_softmax_with_cross_entropy"]
    op = main.global_block().ops[-1]
    assert (op.attr("ring_id"), op.attr("rank"), op.attr("nranks"), op.attr("ignore_index")) \
        == (0, 1, 2, -100)
    assert loss.shape == (-1, 1)


def test_parallel_cross_entropy_takes_the_degree_of_the_strategy_given_to_init(monkeypatch):
    strategy = fleet.DistributedStrategy()
    strategy.tensor_parallel = True
    strategy.tensor_parallel_configs = {"tensor_parallel_degree": 2}
    _world(2, 0, monkeypatch, strategy)
    main, _, _ = _layer(lambda: rf.distributed.parallel_cross_entropy(
        rf.data("logits", [-1, 5]), rf.data("label", [-1, 1], "int64")))
    assert main.global_block().ops[-1].attr("nranks") == 2


# errors ---------------------------------------------------------------------------------------
def test_split_before_fleet_init_is_a_config_error():
    with pytest.raises(ConfigError, match=r"call ringflow\.distributed\.fleet\.init"):
        _layer(lambda: rf.distributed.split(rf.data("x", [-1, 4]), (4, 4), "linear", axis=1,
                                            num_partitions=2))


def test_split_with_another_degree_than_the_strategy_names_both(monkeypatch):
    strategy = fleet.DistributedStrategy()
    strategy.tensor_parallel = True
    strategy.tensor_parallel_configs = {"tensor_parallel_degree": 4}
    _world(4, 0, monkeypatch, strategy)
    with pytest.raises(ConfigError, match="num_partitions=2 differs from the strategy's "
                                          "tensor_parallel_degree=4"):
        _layer(lambda: rf.distributed.split(rf.data("x", [-1, 4]), (4, 4), "linear", axis=1,
                                            num_partitions=2))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"operation": "conv"}, ProgramError, "operation must be 'linear' or 'embedding'"),
    ({"axis": 2}, ProgramError, "split along axis 0 \\(rows\\) or 1 \\(columns\\), got 2"),
    ({"size": (4, 5), "axis": 1}, ProgramError, "output size \\(size\\[1\\]\\) 5 is not "
                                                "divisible by num_partitions=2"),
    ({"num_partitions": 3}, ConfigError, "num_partitions=3 does not divide the world size 4"),
    ({"num_partitions": 0}, ConfigError, "num_partitions must be >= 1, got 0"),
    ({"size": (4,)}, ProgramError, "size must be two positive ints"),
])
def test_split_rejects_bad_arguments_by_name(kwargs, error, message, monkeypatch):
    _world(4, 0, monkeypatch)
    args = {"size": (4, 4), "operation": "linear", "axis": 1, "num_partitions": 2, **kwargs}
    with pytest.raises(error, match=message):
        _layer(lambda: rf.distributed.split(rf.data("x", [-1, 4]), **args))


def test_embedding_split_along_columns_is_refused(monkeypatch):
    _world(2, 0, monkeypatch)
    with pytest.raises(ProgramError, match="an embedding is split along axis 0 only, got 1"):
        _layer(lambda: rf.distributed.split(rf.data("ids", [-1], "int64"), (4, 4), "embedding",
                                            axis=1, num_partitions=2))
