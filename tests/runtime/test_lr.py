"""Learning-rate schedulers equal their closed forms step by step, keep Paddle's
conventions (step 0 on construction, state dicts), and the executor feeds and steps them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ringflow.errors import ConfigError
from ringflow.executor import Executor, Scope
from ringflow.framework.program import Program
from ringflow.optimizer import lr


def values(sched, n):
    out = []
    for _ in range(n):
        out.append(sched())
        sched.step()
    return out


def test_step_decay_multiplies_by_gamma_every_step_size_steps():
    got = values(lr.StepDecay(0.5, step_size=3, gamma=0.1), 10)
    assert got == pytest.approx([0.5 * 0.1 ** (k // 3) for k in range(10)], rel=1e-15)


def test_multistep_decay_multiplies_by_gamma_at_each_milestone():
    got = values(lr.MultiStepDecay(1.0, milestones=[2, 5], gamma=0.5), 7)
    assert got == pytest.approx([1, 1, 0.5, 0.5, 0.5, 0.25, 0.25], rel=1e-15)


def test_exponential_decay_is_gamma_to_the_step():
    got = values(lr.ExponentialDecay(0.3, gamma=0.9), 6)
    assert got == pytest.approx([0.3 * 0.9 ** k for k in range(6)], rel=1e-14)


def test_cosine_annealing_follows_half_cosine_to_eta_min():
    got = values(lr.CosineAnnealingDecay(0.1, T_max=8, eta_min=0.01), 9)
    want = [0.01 + 0.09 * (1 + math.cos(math.pi * k / 8)) / 2 for k in range(9)]
    assert got == pytest.approx(want, rel=1e-14)
    assert got[0] == pytest.approx(0.1) and got[8] == pytest.approx(0.01)


def test_linear_warmup_then_constant():
    got = values(lr.LinearWarmup(0.5, warmup_steps=4, start_lr=0.0, end_lr=0.4), 7)
    assert got == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.5, 0.5, 0.5], rel=1e-15)


def test_linear_warmup_hands_over_to_a_scheduler_starting_at_its_step_zero():
    inner = lr.StepDecay(1.0, step_size=2, gamma=0.5)
    got = values(lr.LinearWarmup(inner, warmup_steps=2, start_lr=0.0, end_lr=1.0), 7)
    assert got == pytest.approx([0.0, 0.5, 1.0, 1.0, 0.5, 0.5, 0.25], rel=1e-15)


def test_step_with_epoch_jumps_to_that_epoch():
    sched = lr.StepDecay(1.0, step_size=2, gamma=0.5)
    sched.step(5)
    assert sched.last_epoch == 5 and sched() == pytest.approx(0.25)


def test_state_dict_round_trip_restores_position():
    a = lr.CosineAnnealingDecay(0.1, T_max=10)
    values(a, 4)
    b = lr.CosineAnnealingDecay(0.1, T_max=10)
    b.set_state_dict(a.state_dict())
    assert (b.last_epoch, b()) == (a.last_epoch, a())
    assert values(b, 3) == values(a, 3)


def test_bad_arguments_are_config_errors_naming_the_argument():
    with pytest.raises(ConfigError, match="step_size"):
        lr.StepDecay(0.1, step_size=0)
    with pytest.raises(ConfigError, match="T_max"):
        lr.CosineAnnealingDecay(0.1, T_max=-1)
    with pytest.raises(ConfigError, match="end_lr"):
        lr.LinearWarmup(0.1, warmup_steps=2, start_lr=0.5, end_lr=0.1)


def test_executor_feeds_the_scheduled_rate_and_steps_the_scheduler_after_each_run():
    # w -= lr_k * g with g = 1: the per-run change of w is the rate of that run.
    prog = Program()
    block = prog.global_block()
    block.create_var(name="w", shape=(1,), dtype="float64", persistable=True)
    block.create_var(name="g", shape=(1,), dtype="float64")
    block.create_var(name="learning_rate_0", shape=(1,), dtype="float64", persistable=True)
    block.append_op("sgd", inputs={"Param": "w", "Grad": "g", "LearningRate": "learning_rate_0"},
                    outputs={"ParamOut": "w"})
    sched = lr.StepDecay(1.0, step_size=2, gamma=0.5)
    sched.var_name, prog.lr_scheduler = "learning_rate_0", sched
    scope = Scope()
    scope["w"] = np.zeros(1)
    exe, seen = Executor(), []
    for _ in range(5):
        before = float(scope["w"][0])
        exe.run(prog, feed={"g": np.ones(1)}, scope=scope)
        seen.append(before - float(scope["w"][0]))
    assert seen == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25], rel=1e-15)
    assert sched.last_epoch == 5


def test_test_clone_does_not_step_the_scheduler():
    prog = Program()
    prog.global_block().create_var(name="learning_rate_0", shape=(1,), dtype="float32",
                                   persistable=True)
    sched = lr.StepDecay(1.0, step_size=1, gamma=0.5)
    sched.var_name, prog.lr_scheduler = "learning_rate_0", sched
    Executor().run(prog.clone(for_test=True), scope=Scope())
    assert sched.last_epoch == 0
