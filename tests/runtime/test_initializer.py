"""Initializers: one Paddle-named op each in the startup program, seeded by name."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ProgramError
from ringflow.framework.layer_helper import create_parameter
from ringflow.initializer import compute_fans


def _init(initializer, shape=(200, 300), seed=0, name="p"):
    """The startup op and the value ``initializer`` gives a parameter of ``shape``."""
    startup = rf.Program()
    startup.random_seed = seed
    block = startup.global_block()
    var = block.create_parameter(name, shape=shape, dtype="float32")
    op = initializer(var, block)
    scope = rf.Scope()
    rf.Executor().run(startup, scope=scope)
    return op, scope[name]


def test_constant_is_one_fill_constant_op():
    op, value = _init(rf.initializer.Constant(0.5), shape=(2, 3))
    assert op.type == "fill_constant"
    assert (op.attr("shape"), op.attr("dtype"), op.attr("value")) == ([2, 3], "float32", 0.5)
    np.testing.assert_array_equal(value, np.full((2, 3), 0.5, np.float32))


def test_normal_is_one_gaussian_random_op_with_the_asked_moments():
    op, value = _init(rf.initializer.Normal(mean=1.0, std=0.5))
    assert op.type == "gaussian_random"
    assert (op.attr("mean"), op.attr("std")) == (1.0, 0.5)
    assert isinstance(op.attr("seed"), int) and op.attr("seed") != 0  # see the seed tests
    assert value.dtype == np.float32 and value.shape == (200, 300)
    assert value.mean() == pytest.approx(1.0, abs=0.01)
    assert value.std() == pytest.approx(0.5, rel=0.02)


def test_uniform_is_one_uniform_random_op_within_its_bounds():
    op, value = _init(rf.initializer.Uniform(low=-0.2, high=0.6))
    assert op.type == "uniform_random"
    assert (op.attr("min"), op.attr("max")) == (-0.2, 0.6)
    assert value.min() >= -0.2 and value.max() < 0.6
    assert value.mean() == pytest.approx(0.2, abs=0.01)


def test_uniform_rejects_empty_range():
    with pytest.raises(ProgramError, match="low < high"):
        rf.initializer.Uniform(low=1.0, high=1.0)


def test_xavier_uniform_limit_follows_fan_in_and_fan_out():
    op, value = _init(rf.initializer.XavierUniform())
    limit = math.sqrt(6.0 / (200 + 300))
    assert op.type == "uniform_random"
    assert (op.attr("min"), op.attr("max")) == pytest.approx((-limit, limit))
    assert np.abs(value).max() <= limit
    assert np.abs(value).max() > 0.99 * limit


def test_xavier_uniform_explicit_fans_override_the_shape():
    op, _ = _init(rf.initializer.XavierUniform(fan_in=10, fan_out=14), shape=(3, 3))
    assert op.attr("max") == pytest.approx(0.5)


def test_xavier_normal_std_follows_fans():
    op, value = _init(rf.initializer.XavierNormal())
    assert op.type == "gaussian_random"
    assert op.attr("std") == pytest.approx(math.sqrt(2.0 / 500))
    assert value.std() == pytest.approx(math.sqrt(2.0 / 500), rel=0.02)


@pytest.mark.parametrize("shape, fans", [
    ((7,), (7, 7)), ((4, 5), (4, 5)), ((8, 3, 2, 2), (12, 32)),
])
def test_fans_are_computed_as_paddle(shape, fans):
    assert compute_fans(shape) == fans


def test_same_random_seed_gives_bitwise_identical_values():
    _, a = _init(rf.initializer.XavierUniform(), seed=3)
    _, b = _init(rf.initializer.XavierUniform(), seed=3)
    _, c = _init(rf.initializer.XavierUniform(), seed=4)
    _, d = _init(rf.initializer.XavierUniform(), seed=3, name="q")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, d)


def _model_startup(seed, pad_ops=0):
    main, startup = rf.Program(), rf.Program()
    startup.random_seed = seed
    with rf.program_guard(main, startup):
        for _ in range(2):
            create_parameter([16, 8], "float32")
            create_parameter([8], "float32", is_bias=True,
                             default_initializer=rf.initializer.Normal())
    for i in range(pad_ops):
        # What a tensor-parallel rewrite does: ops inserted before the initializers.
        startup.global_block()._insert_op(0, "fill_constant", outputs={"Out": f"pad{i}"})
    scope = rf.Scope()
    rf.Executor().run(startup, scope=scope)
    return {p.name: scope[p.name] for p in main.all_parameters()}


def test_parameters_do_not_change_when_ops_are_inserted_into_the_startup_program():
    plain, padded = _model_startup(5), _model_startup(5, pad_ops=3)
    assert sorted(plain) == ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]
    for name in plain:
        np.testing.assert_array_equal(plain[name], padded[name])
    assert not np.array_equal(plain["fc_0.w_0"], plain["fc_1.w_0"])


def test_initializer_refuses_a_shape_with_unknown_dimensions():
    block = rf.Program().global_block()
    var = block.create_var(name="v", shape=[-1, 3])
    with pytest.raises(ProgramError, match=r"cannot initialise 'v': its shape \[-1, 3\]"):
        rf.initializer.Constant()(var, block)


def _shard_values(initializer, full_shape, axis, parts, name="w"):
    """The whole parameter a serial startup gives ``name``, and each shard's value."""
    from ringflow.framework.records import Shard

    def run(shape, shard=None):
        main, startup = rf.Program(), rf.Program()
        startup.random_seed = 5
        with rf.program_guard(main, startup):
            create_parameter(shape, "float32", attr=rf.ParamAttr(name, initializer=initializer),
                             shard=shard)
        scope = rf.Scope()
        rf.Executor().run(startup, scope=scope)
        return scope[name], main.global_block().var(name)

    whole, _ = run(full_shape)
    shards = []
    for index in range(parts):
        shard = Shard(tuple(full_shape), axis, index, parts)
        value, param = run(shard.shape, shard)
        assert param.is_distributed and param.split_axis == axis and param.shard == shard
        shards.append(value)
    return whole, shards


@pytest.mark.parametrize("initializer", [
    rf.initializer.Uniform(-0.3, 0.7), rf.initializer.Normal(0.1, 2.0),
    rf.initializer.XavierUniform(), rf.initializer.XavierNormal(), rf.initializer.Constant(0.25),
], ids=lambda i: type(i).__name__)
@pytest.mark.parametrize("axis", [0, 1])
def test_a_shard_is_bitwise_the_slice_of_the_serial_parameter(initializer, axis):
    whole, shards = _shard_values(initializer, (12, 8), axis, parts=4)
    np.testing.assert_array_equal(np.concatenate(shards, axis=axis), whole)
    assert all(s.flags.c_contiguous for s in shards)


def test_a_sharded_init_op_carries_the_whole_shape_and_its_place():
    from ringflow.framework.records import Shard

    startup = rf.Program()
    block = startup.global_block()
    var = block.create_parameter("w", shape=(12, 2), dtype="float32")
    var.shard = Shard((12, 8), 1, 3, 4)
    op = rf.initializer.XavierUniform()(var, block)
    assert (op.attr("shape"), op.attr("full_shape"), op.attr("shard_axis"),
            op.attr("shard_index")) == ([12, 2], [12, 8], 1, 3)
    assert op.attr("max") == pytest.approx(math.sqrt(6.0 / (12 + 8)))  # fans of the whole


def test_a_shard_that_does_not_fit_its_parameter_is_an_error():
    from ringflow.framework.records import Shard

    with pytest.raises(ProgramError, match="cannot cut dim 1 of shape \\[12, 8\\] into 3"):
        Shard((12, 8), 1, 0, 3)
    with pytest.raises(ProgramError, match="not the shard shape \\[12, 2\\] of \\[12, 8\\]"), \
            rf.program_guard(rf.Program(), rf.Program()):
        create_parameter([12, 3], "float32", attr="w", shard=Shard((12, 8), 1, 0, 4))
