"""TensorParallelOptimizer's rewrite (reference paddle-semantics.md 4.5): for world 1, 2, 4
and degree 1, 2, 4 the rewritten startup and main programs hold exactly Paddle's
communication ops (type, role, ring, root, scale, which parameter or gradient) in order, and a
bad degree changes nothing and names both numbers. Programs are only built here, never run:
fleet.init opens no connection."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.errors import ConfigError
from ringflow.framework import is_backward_op, is_loss_grad_op, is_optimizer_op
from ringflow.framework.layer_helper import create_parameter

F, B, O = 0, 1, 2          # op roles: Forward, Backward, Optimize
COMM = {"c_comm_init", "broadcast", "c_allreduce_sum", "c_sync_calc_stream",
        "c_sync_comm_stream", "c_identity", "mp_allreduce_sum", "c_concat", "c_split"}
MP_OPS = {"c_identity", "mp_allreduce_sum", "c_concat", "c_split"}


def _endpoints(world: int) -> list[str]:
    return [f"10.0.0.{1 + r // 2}:{7000 + r % 2}" for r in range(world)]


def _join(world: int, rank: int, monkeypatch) -> None:
    for name, value in {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world),
                        "PADDLE_TRAINER_ENDPOINTS": ",".join(_endpoints(world)),
                        "PADDLE_TRAINING_ROLE": "TRAINER"}.items():
        monkeypatch.setenv(name, value)
    fleet.init(is_collective=True)


def _strategy(degree) -> rf.distributed.DistributedStrategy:
    strategy = fleet.DistributedStrategy()
    strategy.tensor_parallel = True
    strategy.tensor_parallel_configs = {"tensor_parallel_degree": degree}
    return strategy


def _build(partitions: int, degree, optimizer=None):
    """DESIGN.md section 4's model, minimized by the fleet optimizer; (main, startup)."""
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 64], dtype="float32")
        y = rf.data("y", shape=[-1], dtype="int64")
        h = rf.distributed.split(x, size=(64, 256), operation="linear", axis=1,
                                 num_partitions=partitions, gather_out=False,
                                 weight_attr=rf.ParamAttr(name="fc1.w"),
                                 bias_attr=rf.ParamAttr(name="fc1.b"))
        h = rf.nn.relu(h)
        logits = rf.distributed.split(h, size=(256, 10), operation="linear", axis=0,
                                      num_partitions=partitions,
                                      weight_attr=rf.ParamAttr(name="fc2.w"),
                                      bias_attr=rf.ParamAttr(name="fc2.b"))
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))
        opt = fleet.distributed_optimizer(optimizer or rf.optimizer.SGD(0.1), _strategy(degree))
        opt.minimize(loss)
    return main, startup


def _sig(op) -> tuple:
    """What the rewrite is judged by: type, role, ring, and the op's communication details
    (root, scale, nranks/rank, the variable it moves)."""
    extra = {k: op.attr(k) for k in ("root", "nranks", "rank", "endpoints") if op.has_attr(k)
             and op.type in ("broadcast", "c_comm_init")}
    if op.type == "scale" and op.attr("op_role") == B:
        extra["scale"] = op.attr("scale")
    var = (op.input_arg_names or [None])[0]
    ring = op.attr("ring_id") if op.has_attr("ring_id") else None
    return (op.type, op.attr("op_role"), ring, var, extra or None)


def _comm(program) -> list[tuple]:
    return [_sig(op) for op in program.global_block().ops
            if op.type in COMM or (op.type == "scale" and op.attr("op_role") == B)]


# Paddle's listing for world 4, degree 2, rank 3 (mp group {2, 3}, dp group {1, 3}) --------
def _init_ring(ring, endpoints, rank, sync_var):
    return [("c_comm_init", F, ring, None, {"nranks": len(endpoints), "rank": rank,
                                            "endpoints": ",".join(endpoints)}),
            ("c_allreduce_sum", F, 1, sync_var, None),
            ("c_sync_calc_stream", F, None, sync_var, None)]


def test_world4_degree2_startup_is_paddles_rings_and_broadcasts(monkeypatch):
    _join(4, 3, monkeypatch)
    _, startup = _build(2, 2)
    eps = _endpoints(4)
    syncs = [op.input_arg_names[0] for op in startup.global_block().find_ops(
        type="c_sync_calc_stream")]
    bcast = [("broadcast", F, 2, p, {"root": 0}) for p in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")]
    assert _comm(startup) == [
        *_init_ring(1, eps, 3, syncs[0]),
        *_init_ring(0, eps[2:], 1, syncs[1]),
        ("broadcast", F, 0, "fc2.b", {"root": 0}),       # the one replicated parameter
        ("c_sync_comm_stream", F, 0, "fc2.b", None),
        *_init_ring(2, [eps[1], eps[3]], 1, syncs[2]),
        *bcast,
        ("c_sync_comm_stream", F, 2, "fc2.b", None),
    ]
    # the initializers come first, untouched; each sync variable is a fresh int32 [1]
    assert [op.type for op in startup.global_block().ops[:5]] == [
        "uniform_random", "fill_constant", "uniform_random", "fill_constant", "fill_constant"]
    assert len(set(syncs)) == 3


def test_world4_degree2_main_program_is_paddles_listing(monkeypatch):
    _join(4, 3, monkeypatch)
    main, _ = _build(2, 2)
    got = [(op.type, op.attr("op_role"), op.attr("ring_id") if op.type in COMM else None)
           for op in main.global_block().ops]
    assert got == [
        ("c_identity", F, 0), ("matmul_v2", F, None), ("elementwise_add", F, None),
        ("relu", F, None), ("matmul_v2", F, None), ("mp_allreduce_sum", F, 0),
        ("elementwise_add", F, None), ("softmax_with_cross_entropy", F, None),
        ("reduce_mean", 256, None), ("fill_constant", 257, None), ("scale", B, None),
        ("reduce_mean_grad", B, None), ("softmax_with_cross_entropy_grad", B, None),
        ("elementwise_add_grad", B, None),
        ("c_sync_calc_stream", B, None), ("c_allreduce_sum", B, 2),
        ("c_identity", B, 0), ("matmul_v2_grad", B, None),
        ("c_sync_calc_stream", B, None), ("c_allreduce_sum", B, 2),
        ("relu_grad", B, None), ("elementwise_add_grad", B, None),
        ("c_sync_calc_stream", B, None), ("c_allreduce_sum", B, 2),
        ("matmul_v2_grad", B, None),
        ("c_sync_calc_stream", B, None), ("c_allreduce_sum", B, 2),
        ("c_sync_comm_stream", B, 2),
        ("sgd", O, None), ("sgd", O, None), ("sgd", O, None), ("sgd", O, None),
    ]
    block = main.global_block()
    assert block.find_ops(type="scale", pred=is_backward_op)[0].attr("scale") == 0.5
    reduced = [op.input("X")[0] for op in block.find_ops(type="c_allreduce_sum")]
    assert reduced == ["fc2.b@GRAD", "fc2.w@GRAD", "fc1.b@GRAD", "fc1.w@GRAD"]


# every (world, degree) against the rules of reference 4.5 -------------------------------------
CONFIGS = [(w, d) for w in (1, 2, 4) for d in (1, 2, 4) if w % d == 0]


def _expected_startup(world: int, degree: int, rank: int, params: dict[str, bool],
                      syncs: list[str]) -> list[tuple]:
    """The rings and broadcasts of reference 4.5, derived from the rules: global ring 1 over
    all, mp ring 0 over the contiguous block, dp ring 2 over every degree-th rank."""
    eps = _endpoints(world)
    group = rank // degree
    mp_eps = eps[group * degree:(group + 1) * degree]
    out = [*_init_ring(1, eps, rank, syncs[0]), *_init_ring(0, mp_eps, rank % degree, syncs[1])]
    replicated = [p for p, dist in params.items() if not dist]
    out += [("broadcast", F, 0, p, {"root": 0}) for p in replicated]
    if replicated:
        out.append(("c_sync_comm_stream", F, 0, replicated[-1], None))
    if world > degree:
        dp_eps = [eps[rank % degree + i * degree] for i in range(world // degree)]
        out += _init_ring(2, dp_eps, group, syncs[2])
        out += [("broadcast", F, 2, p, {"root": 0}) for p in params]
        out.append(("c_sync_comm_stream", F, 2, list(params)[-1], None))
    return out


@pytest.mark.parametrize("world, degree", CONFIGS)
def test_startup_holds_the_rings_and_broadcasts_of_every_layout(world, degree, monkeypatch):
    rank = world - 1
    _join(world, rank, monkeypatch)
    _, startup = _build(degree, degree)
    params = {p.name: p.is_distributed for p in startup.global_block().iter_parameters()}
    assert list(params) == ["fc1.w", "fc1.b", "fc2.w", "fc2.b"]
    assert params == {"fc1.w": degree > 1, "fc1.b": degree > 1, "fc2.w": degree > 1,
                      "fc2.b": False}
    syncs = [op.input_arg_names[0] for op in startup.global_block().find_ops(
        type="c_sync_calc_stream")]
    assert _comm(startup) == _expected_startup(world, degree, rank, params, syncs)


@pytest.mark.parametrize("world, degree", CONFIGS)
def test_main_program_gets_scale_and_gradient_all_reduces_only_with_data_parallelism(
        world, degree, monkeypatch):
    _join(world, world - 1, monkeypatch)
    main, _ = _build(degree, degree)
    block = main.global_block()
    scales = block.find_ops(type="scale", pred=is_backward_op)
    allreduces = block.find_ops(type="c_allreduce_sum", pred=is_backward_op)
    model_parallel = [op.type for op in block.ops if op.type in MP_OPS]
    if degree > 1:
        assert model_parallel == ["c_identity", "mp_allreduce_sum", "c_identity"]
    else:
        assert model_parallel == []
    if world == degree:
        assert scales == [] and allreduces == [] and not block.find_ops(type="c_sync_comm_stream")
        return
    loss_grad = block.find_ops(is_loss_grad_op)[0]
    assert block.ops[block.index_of(loss_grad) + 1] is scales[0]
    assert scales[0].attr("scale") == 1.0 / (world // degree)
    assert scales[0].input_arg_names == scales[0].output_arg_names == loss_grad.output_arg_names
    for ar in allreduces:         # right after the op that last writes the gradient
        grad = ar.input("X")[0]
        assert ar.attr("ring_id") == 2 and ar.output("Out") == [grad]
        writer = block.find_ops(is_backward_op, output=grad)[0]
        i = block.index_of(writer)
        assert block.ops[i + 1].type == "c_sync_calc_stream" and block.ops[i + 2] is ar
    assert sorted(ar.input("X")[0] for ar in allreduces) == sorted(
        f"{p}@GRAD" for p in ("fc1.w", "fc1.b", "fc2.w", "fc2.b"))
    first_update = block.find_ops(is_optimizer_op)[0]
    before = block.ops[block.index_of(first_update) - 1]
    assert (before.type, before.attr("ring_id"), before.attr("op_role")) == (
        "c_sync_comm_stream", 2, B)


def test_pairs_of_one_op_are_reduced_in_paddles_order(monkeypatch):
    """An op writing two parameter gradients gets one sync, then the later pair's all-reduce
    before the earlier one's (Paddle inserts every pair at the same offset)."""
    _join(2, 0, monkeypatch)
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        a = rf.data("a", [-1, 3])
        w1 = create_parameter([3, 3], attr="w1")
        w2 = create_parameter([3, 3], attr="w2")
        loss = rf.nn.mean(rf.nn.matmul(a, rf.nn.matmul(w1, w2)))   # w1 @ w2: one grad op
        fleet.distributed_optimizer(rf.optimizer.SGD(0.1), _strategy(1)).minimize(loss)
    block = main.global_block()
    writer = next(op for op in block.ops if op.type == "matmul_v2_grad"
                  and set(op.output_arg_names) == {"w1@GRAD", "w2@GRAD"})
    assert writer.attr("op_role_var") == ["w2", "w2@GRAD", "w1", "w1@GRAD"]
    i = block.index_of(writer)
    assert [(op.type, op.input_arg_names[0]) for op in block.ops[i + 1:i + 4]] == [
        ("c_sync_calc_stream", "w2@GRAD"), ("c_allreduce_sum", "w1@GRAD"),
        ("c_allreduce_sum", "w2@GRAD")]


# model parallelism's additions --------------------------------------------------------------
def test_clip_under_model_parallelism_all_reduces_the_sharded_sum_of_squares(monkeypatch):
    _join(2, 1, monkeypatch)
    clip = rf.ClipGradByGlobalNorm(1.0)
    main, _ = _build(2, 2, rf.optimizer.Adam(1e-3, grad_clip=clip))
    block = main.global_block()
    dist_sum = next(op for op in block.ops if op.type == "sum"
                    and op.output_arg_names[0].startswith("global_norm_sq_distributed"))
    after = block.ops[block.index_of(dist_sum) + 1]
    assert (after.type, after.attr("ring_id"), after.attr("op_role")) == (
        "c_allreduce_sum", 0, O)
    assert after.input_arg_names == after.output_arg_names == dist_sum.output_arg_names
    squared = [op.input("X")[0] for op in block.ops if op.type == "squared_l2_norm"]
    assert dist_sum.input("X") == [f"{g}_squared_l2_norm_0" for g in squared
                                   if g.split("@")[0] != "fc2.b"]
    # replicated gradients (fc2.b) are summed apart and not all-reduced: counted once
    assert [op.type for op in block.ops if op.type == "c_allreduce_sum"] == ["c_allreduce_sum"]


@pytest.mark.parametrize("optimizer", [
    lambda: rf.optimizer.Lamb(1e-3), lambda: rf.optimizer.Lars(0.1, momentum=0.9)],
    ids=["lamb", "lars"])
def test_trust_ratio_updates_of_shards_reduce_their_norms_over_the_mp_ring(optimizer,
                                                                          monkeypatch):
    _join(2, 0, monkeypatch)
    main, _ = _build(2, 2, optimizer())
    rings = {op.input("Param")[0]: op.attr("ring_id")
             for op in main.global_block().ops if op.has_attr("ring_id") and "Param" in op.inputs}
    assert rings == {"fc1.b": 0, "fc1.w": 0, "fc2.b": -1, "fc2.w": 0}


def test_degree_one_in_a_world_of_one_makes_rings_of_one_and_no_main_program_change(
        monkeypatch):
    fleet.init(is_collective=True)
    main, startup = _build(1, 1)
    assert [op.type for op in startup.global_block().find_ops(type="c_comm_init")] == [
        "c_comm_init", "c_comm_init"]
    assert not [op for op in main.global_block().ops if op.type in COMM]
    assert fleet._get_applied_meta_list() == ["TensorParallelOptimizer"]


# a bad degree changes nothing ----------------------------------------------------------------
def _unminimized(partitions: int, gather_out: bool = True):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 8])
        h = rf.distributed.split(x, (8, 8), "linear", axis=1, num_partitions=partitions,
                                 gather_out=gather_out, weight_attr="w")
        loss = rf.nn.mean(h)
    return main, startup, loss


@pytest.mark.parametrize("degree, message", [
    (3, "tensor_parallel_degree=3 does not divide the world size 4"),
    (8, "tensor_parallel_degree=8 does not divide the world size 4"),
])
def test_a_degree_that_does_not_divide_the_world_changes_nothing_and_names_both(
        degree, message, monkeypatch):
    _join(4, 0, monkeypatch)
    main, startup, loss = _unminimized(1)
    before = str(main), str(startup)
    opt = fleet.distributed_optimizer(rf.optimizer.SGD(0.1), _strategy(degree))
    with pytest.raises(ConfigError, match=message), rf.program_guard(main, startup):
        opt.minimize(loss)
    assert (str(main), str(startup)) == before


@pytest.mark.parametrize("gather_out, message", [
    (True, "op 3 \\(c_concat\\) was built with num_partitions=2, but the strategy's "
           "tensor_parallel_degree is 4"),
    (False, "parameter 'w' is split into 2 partitions, but the strategy's "
            "tensor_parallel_degree is 4"),
])
def test_layers_built_for_another_degree_change_nothing_and_name_both(gather_out, message,
                                                                       monkeypatch):
    _join(4, 0, monkeypatch)
    main, startup, loss = _unminimized(2, gather_out)
    before = str(main), str(startup)
    opt = fleet.distributed_optimizer(rf.optimizer.SGD(0.1), _strategy(4))
    with pytest.raises(ConfigError, match=message), rf.program_guard(main, startup):
        opt.minimize(loss)
    assert (str(main), str(startup)) == before
