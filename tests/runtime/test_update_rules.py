"""The update-rule table (ops/update_rules.py) is the one place that names an optimizer:
its op, class, job-spec name, state slots and fused sweep; the fused step, the job spec and
sharding read it."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.framework.registry import get_op_def
from ringflow.ops.update_rules import RULES
from ringflow.train import optim


@pytest.mark.parametrize("op", sorted(RULES))
def test_each_rule_names_a_registered_op_its_class_and_slots_of_that_op(op):
    rule = RULES[op]
    opdef = get_op_def(op)
    slots = {s.name for s in opdef.inputs}
    assert {"Param", "Grad", "LearningRate", *rule.state, *rule.pows} == slots
    assert getattr(rf.optimizer, rule.optimizer).type == op
    assert rule.state[0] == "Param" and "Param" not in rule.state_slots


def test_the_job_spec_takes_exactly_the_rules_spec_names():
    assert sorted(optim.OPTIMIZER_CLASSES) == sorted(r.spec_name for r in RULES.values())
    for rule in RULES.values():
        assert optim.optimizer_classes()[rule.spec_name] == rule.optimizer


def test_every_optimizer_class_has_a_rule():
    classes = [c for c in vars(rf.optimizer).values()
               if isinstance(c, type) and issubclass(c, rf.optimizer.Optimizer) and c.type]
    assert {c.type for c in classes} == set(RULES)


def test_whole_parameter_norms_are_lamb_and_lars():
    assert {op for op, r in RULES.items() if r.whole_norms} == {"lamb", "lars_momentum"}
