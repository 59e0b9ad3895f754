"""Gradient buckets as the executor plans them (ringflow.compiler.buckets), for programs
TensorParallelOptimizer rewrote for a data-parallel world of 2; programs are only prepared
here, never run (fleet.init opens no connection). Runs: test_buckets.py."""

from __future__ import annotations

import numpy as np

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.models import mlp
from tests.runtime.distributed.fleet.test_tensor_parallel_rewrite import _join, _strategy


def _dp_program(monkeypatch, degree=1, world=2, layers=2, hidden=64, clip=None):
    _join(world, 0, monkeypatch)
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = mlp(input_size=16, hidden_size=hidden, num_classes=8, num_layers=layers,
                    mp_degree=degree)
        opt = rf.optimizer.Adam(1e-3, grad_clip=clip)
        fleet.distributed_optimizer(opt, _strategy(degree)).minimize(model.loss)
    return main


def _plan(main, **strategy):
    return rf.Executor().prepared(rf.CompiledProgram(main, rf.BuildStrategy(**strategy)))


def _grad_bytes(main) -> int:
    return sum(int(np.prod(p.shape)) * 4 for p in main.all_parameters())


def test_the_per_gradient_allreduces_become_one_bucket_in_backward_order(monkeypatch):
    main = _dp_program(monkeypatch)
    program_allreduces = [op.input("X")[0] for op in main.global_block().ops
                          if op.type == "c_allreduce_sum"]
    plan = _plan(main)
    assert plan.count("c_allreduce_sum") == 0 and plan.count("c_sync_calc_stream") == 0
    (bucket,) = plan.buckets
    assert bucket.names == program_allreduces            # the order they were all-reduced in
    assert (bucket.ring_id, bucket.nbytes, bucket.dtype) == (2, _grad_bytes(main),
                                                             np.dtype("float32"))
    types = [s.op.type for s in plan.steps]
    launch, sync = types.index("bucket_allreduce"), types.index("c_sync_comm_stream")
    assert types[launch - 1] == "fused_gemm_epilogue_grad"   # right after the last gradient
    assert launch < sync < types.index("adam")               # the optimizer waits for it


def test_a_bucket_holds_at_most_fuse_grad_size_in_MB_but_one_steps_gradients_together(
        monkeypatch):
    main = _dp_program(monkeypatch, layers=3)
    limit = 64 * 64 * 4 + 64 * 4                 # one hidden layer's weight and bias
    plan = _plan(main, fuse_grad_size_in_MB=limit / (1 << 20))
    assert len(plan.buckets) > 2
    writer = {n: pos for pos, s in enumerate(plan.steps) for n in s.op.output_arg_names
              if s.op.type not in ("bucket_allreduce", "bucket_wait")}
    for b in plan.buckets:
        sizes = [int(np.prod(shape)) * 4 for shape in b.shapes]
        within = next((k for k in range(len(sizes), 0, -1) if sum(sizes[:k]) <= limit), 1)
        # past the size only gradients that the step of the last one within it writes too
        assert {writer[n] for n in b.names[within - 1:]} == {writer[b.names[within - 1]]}, b
    assert [n for b in plan.buckets for n in b.names] == [
        op.input("X")[0] for op in main.global_block().ops if op.type == "c_allreduce_sum"]
    # each bucket is launched as soon as its last gradient is written: before the next
    # layer's gradient op, so the all-reduce can overlap the rest of the backward pass
    types = [s.op.type for s in plan.steps]
    first_launch = types.index("bucket_allreduce")
    assert "fused_gemm_epilogue_grad" in types[first_launch:]


def test_without_fuse_all_reduce_ops_the_program_ops_run_as_written(monkeypatch):
    main = _dp_program(monkeypatch)
    plan = _plan(main, fuse_all_reduce_ops=False)
    assert plan.buckets == []
    assert plan.count("c_allreduce_sum") == len(list(main.all_parameters()))
    # fusion still applies: the per-gradient all-reduce between a layer's grad ops moves
    assert plan.count("fused_gemm_epilogue_grad") == 4


def test_clipping_reads_the_reduced_gradients(monkeypatch):
    """Global-norm clip's squared norms read the gradients: the bucket is waited for first."""
    main = _dp_program(monkeypatch, clip=rf.ClipGradByGlobalNorm(1.0))
    plan = _plan(main)
    types = [s.op.type for s in plan.steps]
    first_reader = next(i for i, s in enumerate(plan.steps) if s.op.type not in (
        "bucket_allreduce", "bucket_wait", "c_sync_comm_stream") and any(
        n in s.op.input_arg_names for n in plan.buckets[0].names) and i > types.index(
        "bucket_allreduce"))
    waits = [i for i, t in enumerate(types) if t in ("bucket_wait", "c_sync_comm_stream")]
    assert types.index("bucket_allreduce") < min(waits) < first_reader


def test_tensor_parallel_gradients_of_two_dtypes_or_rings_never_share_a_bucket(monkeypatch):
    main = _dp_program(monkeypatch, degree=2, world=4)
    plan = _plan(main)
    assert {b.ring_id for b in plan.buckets} == {2}          # dp only: mp ops stay as they are
    assert plan.count("c_identity") + plan.count("mp_allreduce_sum") > 0


def test_a_single_process_has_no_buckets():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = mlp(input_size=4, hidden_size=8, num_classes=2)
        rf.optimizer.SGD(0.1).minimize(model.loss)
    assert rf.Executor().prepared(main).buckets == []
