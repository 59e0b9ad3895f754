"""ClipGradByGlobalNorm: in-program ops equal numpy's global-norm clipping; every op has
role Optimize; the sum of squares of distributed (tensor-parallel) parameters is kept in its
own variable, where a tensor-parallel pass would all-reduce it."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow import optimizer as opt
from ringflow.errors import ConfigError
from ringflow.executor import Executor, Scope
from ringflow.framework.program import Program, program_guard
from ringflow.framework.roles import OP_ROLE_VAR_KEY, OpRole
from ringflow.optimizer.clip import DIST_SQ_PREFIX, distributed_sq_ops

SHAPES = {"a": (3, 4), "b": (4,), "c": (2, 2)}


def clip_program(clip_norm, distributed=(), unclipped=()):
    main, startup = Program(), Program()
    with program_guard(main, startup):
        block = main.global_block()
        pairs = []
        for name, shape in SHAPES.items():
            p = block.create_parameter(name, shape, "float64")
            p.is_distributed = name in distributed
            p.need_clip = name not in unclipped
            g = block.create_var(name=f"{name}@GRAD", shape=shape, dtype="float64",
                                 is_data=True)
            pairs.append((p, g))
        out = opt.ClipGradByGlobalNorm(clip_norm)(pairs)
    return main, out


def run_clip(clip_norm, scale=1.0, distributed=(), unclipped=()):
    main, pairs = clip_program(clip_norm, distributed, unclipped)
    rng = np.random.default_rng(0)
    grads = {f"{n}@GRAD": scale * rng.standard_normal(s) for n, s in SHAPES.items()}
    scope = Scope()
    Executor().run(main, feed=grads, scope=scope)
    return grads, {g.name: scope[g.name] for _, g in pairs}


def numpy_clip(grads, clip_norm):
    norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
    return {k: g * (clip_norm / max(norm, clip_norm)) for k, g in grads.items()}


@pytest.mark.parametrize("distributed", [(), ("a", "c")])
def test_large_gradients_are_scaled_to_the_clip_norm(distributed):
    grads, clipped = run_clip(1.5, scale=3.0, distributed=distributed)
    want = numpy_clip(grads, 1.5)
    for k in grads:
        np.testing.assert_allclose(clipped[k], want[k], rtol=1e-13)
    total = np.sqrt(sum(np.sum(g * g) for g in clipped.values()))
    assert total == pytest.approx(1.5, rel=1e-13)


def test_small_gradients_pass_unchanged():
    grads, clipped = run_clip(100.0)
    for k in grads:
        np.testing.assert_allclose(clipped[k], grads[k], rtol=1e-15)


def test_every_clip_op_has_role_optimize_and_per_grad_ops_name_their_pair():
    main, _ = clip_program(1.0)
    ops = main.global_block().ops
    assert all(op.attr("op_role") == int(OpRole.Optimize) for op in ops)
    per_grad = [op for op in ops if op.type in ("squared_l2_norm", "elementwise_mul")]
    assert len(per_grad) == 2 * len(SHAPES)
    for op in per_grad:
        g = op.input("X")[0]
        assert op.attr(OP_ROLE_VAR_KEY) == [g[:-len("@GRAD")], g]
    muls = [op for op in ops if op.type == "elementwise_mul"]
    assert all(op.output("Out") == op.input("X") for op in muls)  # in place, as Paddle


def test_distributed_partial_sum_of_squares_has_its_own_op():
    main, _ = clip_program(1.0, distributed=("a",))
    found = distributed_sq_ops(main.global_block())
    assert len(found) == 1
    index, op = found[0]
    assert op.type == "sum" and op.output("Out")[0].startswith(DIST_SQ_PREFIX)
    assert op.input("X") == ["a@GRAD_squared_l2_norm_0"]
    later = [o.type for o in main.global_block().ops[index + 1:]]
    assert later[:3] == ["sum", "sum", "sqrt"]  # replicated partial, total, norm
    plain, _ = clip_program(1.0)
    assert distributed_sq_ops(plain.global_block()) == []


def test_optimizer_clips_before_updating():
    main, startup = Program(), Program()
    with program_guard(main, startup):
        block = main.global_block()
        p = block.create_parameter("w", (2,), "float64")
        g = block.create_var(name="w@GRAD", shape=(2,), dtype="float64", is_data=True)
        opt.SGD(0.1, grad_clip=opt.ClipGradByGlobalNorm(1.0)).apply_gradients([(p, g)])
    assert main.global_block().ops[-1].type == "sgd"
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    scope["w"] = np.zeros(2)
    exe.run(main, feed={"w@GRAD": np.array([3.0, 4.0])}, scope=scope)
    np.testing.assert_allclose(scope["w"], [-0.06, -0.08], rtol=1e-14)


def test_clip_norm_must_be_positive():
    with pytest.raises(ConfigError, match="clip_norm"):
        opt.ClipGradByGlobalNorm(0.0)


def test_parameters_with_need_clip_false_are_neither_counted_nor_scaled():
    grads, clipped = run_clip(1.5, scale=3.0, unclipped=("b",))
    want = numpy_clip({k: g for k, g in grads.items() if k != "b@GRAD"}, 1.5)
    np.testing.assert_array_equal(clipped["b@GRAD"], grads["b@GRAD"])
    for k, g in want.items():
        np.testing.assert_allclose(clipped[k], g, rtol=1e-13)
