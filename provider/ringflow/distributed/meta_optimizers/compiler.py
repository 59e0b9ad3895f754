"""Paddle's MetaOptimizerFactory and StrategyCompiler (reference paddle-semantics.md 2.2, 2.4):
every candidate is built, and the applicable ones are chained along their white lists."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from ringflow.errors import ConfigError

from . import META_OPTIMIZER_CLASSES
from .base import MetaOptimizerBase


class MetaOptimizerFactory:
    def _get_valid_meta_optimizers(self, user_defined_optimizer: Any,
                                   classes: Sequence[type] = META_OPTIMIZER_CLASSES,
                                   ) -> list[MetaOptimizerBase]:
        """One instance of every candidate class, each wrapping the user's optimizer."""
        return [cls(user_defined_optimizer) for cls in classes]


def create_graph(optimizers: Sequence[MetaOptimizerBase]) -> list[list[int]]:
    """``successors[i]``: the indices j that optimizers[i] may wrap (i._can_update(j))."""
    return [[j for j, inner in enumerate(optimizers) if outer._can_update(inner)]
            for outer in optimizers]


def topo_sort(successors: list[list[int]], optimizers: Sequence[MetaOptimizerBase]) -> list[int]:
    """A topological order (Kahn); white lists that let optimizers wrap each other in a
    circle have none, and that is an error (Paddle asserts "... contains ring")."""
    indegree = [0] * len(successors)
    for succ in successors:
        for j in succ:
            indegree[j] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for j in successors[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if len(order) < len(successors):
        stuck = [type(optimizers[i]).__name__ for i in range(len(successors)) if i not in order]
        raise ConfigError("the meta-optimizers' white lists form a cycle (each may wrap the "
                          f"next, without end) among: {', '.join(stuck)}")
    return order


def longest_chain(successors: list[list[int]], order: list[int]) -> list[int]:
    """Indices of the longest wrapping chain, outermost first. Ties go to the earlier index,
    so with no edges at all the chain is [0]: only the first (alphabetical) candidate is
    used, as Paddle's ``floyd`` returns."""
    length = [1] * len(successors)
    inner: list[int | None] = [None] * len(successors)
    for i in reversed(order):  # every successor's length is final before i's
        for j in successors[i]:  # ascending, and ">" keeps the earliest of equal ones
            if length[j] + 1 > length[i]:
                length[i], inner[i] = length[j] + 1, j
    node: int | None = max(range(len(successors)), key=lambda i: (length[i], -i))
    chain = []
    while node is not None:
        chain.append(node)
        node = inner[node]
    return chain


def maximum_path_len_algo(optimizers: Sequence[MetaOptimizerBase],
                          ) -> list[MetaOptimizerBase] | None:
    """The chosen chain, each wrapping the next; the last keeps the user's optimizer it was
    built with. None when there are no candidates."""
    if not optimizers:
        return None
    successors = create_graph(optimizers)
    chain = [optimizers[i] for i in longest_chain(successors, topo_sort(successors, optimizers))]
    for outer, inner in pairwise(chain):
        outer._update_inner_optimizer(inner)
    return chain


class StrategyCompiler:
    """Picks the meta-optimizer chain and the graph optimizer from the applicable ones and
    remembers what it applied (``_get_applied_meta_list``)."""

    def __init__(self) -> None:
        self._meta_optimizer_candidates: list[MetaOptimizerBase] = []
        self._graph_optimizer_candidates: list[MetaOptimizerBase] = []
        self._meta_optimizers: list[MetaOptimizerBase] = []
        self._graph_optimizers: list[MetaOptimizerBase] = []
        self._user_defined_strategy = None

    def _get_applied_meta_list(self) -> list[str]:
        return [type(opt).__name__ for opt in self._meta_optimizers]

    def _get_applied_graph_list(self) -> list[str]:
        return [type(opt).__name__ for opt in self._graph_optimizers]

    def generate_optimizer(self, loss, role_maker, optimizer, user_defined_strategy,
                           meta_optimizer_list, graph_optimizer_list):
        """(outermost meta-optimizer or None, graph optimizer or None). A graph optimizer
        that any chosen meta-optimizer black-lists is dropped."""
        self._user_defined_strategy = user_defined_strategy
        self._meta_optimizer_candidates = list(meta_optimizer_list)
        self._graph_optimizer_candidates = list(graph_optimizer_list)
        meta = maximum_path_len_algo(meta_optimizer_list) or []
        graph = maximum_path_len_algo(graph_optimizer_list) or []
        if any(type(g).__name__ in m.meta_optimizers_black_list for g in graph for m in meta):
            graph = []
        self._meta_optimizers, self._graph_optimizers = meta, graph
        return (meta[0] if meta else None), (graph[0] if graph else None)
