"""The meta-optimizer factory and strategy compiler, with stand-in meta-optimizers
(standins.py: Paddle's class names and white lists, no program rewrites) next to ringflow's
real TensorParallelOptimizer, whose rewrite is not exercised here."""

from __future__ import annotations

import pytest

from ringflow import optimizer
from ringflow.distributed.meta_optimizers import META_OPTIMIZER_CLASSES, TensorParallelOptimizer
from ringflow.distributed.meta_optimizers.compiler import MetaOptimizerFactory, StrategyCompiler
from ringflow.errors import ConfigError

from .standins import (
    AMPOptimizer,
    GraphExecutionOptimizer,
    LambOptimizer,
    LarsOptimizer,
    PingOptimizer,
    PongOptimizer,
    RecomputeOptimizer,
)


def candidates(*classes):
    user = optimizer.SGD(0.1)
    return user, MetaOptimizerFactory()._get_valid_meta_optimizers(user, classes)


def compile_meta(meta_list, graph_list=()):
    compiler = StrategyCompiler()
    chosen = compiler.generate_optimizer(None, None, None, None, meta_list, list(graph_list))
    return compiler, chosen


def test_the_factory_builds_one_candidate_per_class_each_wrapping_the_user_optimizer():
    user, opts = candidates(AMPOptimizer, TensorParallelOptimizer)
    assert [type(o) for o in opts] == [AMPOptimizer, TensorParallelOptimizer]
    assert all(o.inner_opt is user for o in opts)


def test_the_factory_defaults_to_ringflows_classes_in_alphabetical_order():
    opts = MetaOptimizerFactory()._get_valid_meta_optimizers(optimizer.SGD(0.1))
    names = [type(o).__name__ for o in opts]
    assert names == sorted(names) == [c.__name__ for c in META_OPTIMIZER_CLASSES]
    assert "TensorParallelOptimizer" in names


def test_without_edges_only_the_first_candidate_is_used():
    user, (lamb, lars) = candidates(LambOptimizer, LarsOptimizer)
    compiler, (meta, graph) = compile_meta([lamb, lars])
    assert (meta, graph) == (lamb, None)
    assert compiler._get_applied_meta_list() == ["LambOptimizer"]
    assert lamb.inner_opt is user


def test_tensor_parallel_wraps_amp_which_wraps_the_user_optimizer():
    user, (amp, tp) = candidates(AMPOptimizer, TensorParallelOptimizer)
    compiler, (meta, _) = compile_meta([amp, tp])
    assert meta is tp and tp.inner_opt is amp and amp.inner_opt is user
    assert compiler._get_applied_meta_list() == ["TensorParallelOptimizer", "AMPOptimizer"]


def test_the_longest_chain_is_chosen():
    user, opts = candidates(AMPOptimizer, LarsOptimizer, RecomputeOptimizer,
                            TensorParallelOptimizer)
    compiler, _ = compile_meta(opts)
    assert compiler._get_applied_meta_list() == [
        "TensorParallelOptimizer", "AMPOptimizer", "RecomputeOptimizer", "LarsOptimizer"]
    assert opts[1].inner_opt is user  # Lars, innermost


def test_white_lists_that_form_a_cycle_are_an_error_naming_the_classes():
    _, opts = candidates(PingOptimizer, PongOptimizer)
    with pytest.raises(ConfigError, match=r"form a cycle .* among: PingOptimizer, PongOptimizer"):
        compile_meta(opts)


def test_no_candidates_give_no_optimizers():
    compiler, chosen = compile_meta([])
    assert chosen == (None, None) and compiler._get_applied_meta_list() == []


def test_a_graph_optimizer_is_returned_beside_the_meta_chain():
    _, (graph_opt, amp) = candidates(GraphExecutionOptimizer, AMPOptimizer)
    compiler, chosen = compile_meta([amp], [graph_opt])
    assert chosen == (amp, graph_opt)
    assert compiler._get_applied_graph_list() == ["GraphExecutionOptimizer"]


def test_a_graph_optimizer_black_listed_by_a_chosen_meta_optimizer_is_dropped():
    _, (graph_opt, amp) = candidates(GraphExecutionOptimizer, AMPOptimizer)
    amp.meta_optimizers_black_list = ["GraphExecutionOptimizer"]
    compiler, chosen = compile_meta([amp], [graph_opt])
    assert chosen == (amp, None) and compiler._get_applied_graph_list() == []
