"""``rf.distributed.fleet``: Paddle's fleet API for static-graph collective training, backed by
one ``Fleet`` object whose methods the module-level names are.

    fleet.init(role_maker=None, is_collective=False, strategy=None); fleet.is_initialized()
    fleet.worker_index() / worker_num() / node_num() / is_first_worker() / is_worker()
    fleet.worker_endpoints(to_string=False)      # one "ip:port" per rank
    fleet.barrier_worker()                        # the only call that connects
    fleet.distributed_optimizer(optimizer, strategy=None).minimize(loss, ...)
    fleet.DistributedStrategy, PaddleCloudRoleMaker, UserDefinedRoleMaker, Role

``init`` reads the env contract (no sockets: programs can be built, printed and verified
without peers) and may be called again: a re-init replaces the role maker and the strategy.
After ``minimize``, ``fleet._get_applied_meta_list()`` names the applied meta-optimizers
(outermost first) and ``fleet._final_strategy()`` is the strategy with every meta-optimizer
not applied disabled, as Paddle's.

For parallel layers (e.g. ``distributed.split``) checking their arguments at build time:
``fleet.is_initialized()`` says whether ``init`` ran; ``fleet.worker_num()`` and
``fleet.worker_index()`` read the world (``fleet._role_maker()`` is the role maker itself,
None before ``init``); ``fleet.get_strategy()`` is a copy of the strategy given to ``init``
or, later, to ``distributed_optimizer`` (None if none was given: the degree is not known yet).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

from ringflow.compiler.build_strategy import DEFAULT_BUILD_STRATEGY
from ringflow.distributed import meta_optimizers
from ringflow.distributed.collective import api as collective
from ringflow.distributed.hybrid import apply_hybrid, hybrid_degrees
from ringflow.distributed.meta_optimizers import fp16_allreduce, gradient_merge
from ringflow.distributed.meta_optimizers.base import MetaOptimizerBase
from ringflow.distributed.meta_optimizers.compiler import MetaOptimizerFactory, StrategyCompiler
from ringflow.distributed.role_maker import (
    PaddleCloudRoleMaker,
    Role,
    RoleMakerBase,
    UserDefinedRoleMaker,
)
from ringflow.distributed.strategy import DistributedStrategy
from ringflow.errors import ConfigError
from ringflow.framework.program import default_startup_program, program_guard

__all__ = [
    "DistributedStrategy", "Fleet", "PaddleCloudRoleMaker", "Role", "UserDefinedRoleMaker",
    "barrier_worker", "distributed_optimizer", "get_strategy", "init", "is_first_worker",
    "is_initialized", "is_worker", "node_num", "worker_endpoints", "worker_index", "worker_num",
]

log = logging.getLogger("ringflow.distributed")
# the option names fleet has warned about in this process (one warning per job)
_warned_without_effect: set[str] = set()


class DistributedOptimizer:
    """What ``distributed_optimizer`` returns: ``minimize`` applies the meta-optimizer chain
    that the strategy and the world allow (Paddle's ``Fleet._minimize_impl``, reference
    paddle-semantics.md 2.3) and returns what the outermost one returns."""

    def __init__(self, optimizer: Any, strategy: DistributedStrategy, role_maker: RoleMakerBase,
                 meta_optimizer_classes: Sequence[type] | None = None) -> None:
        self.user_defined_optimizer = optimizer
        self.user_defined_strategy = strategy
        self._role_maker = role_maker
        # None: ringflow's own candidates, looked up when minimize runs
        self._meta_optimizer_classes = meta_optimizer_classes
        self._context: dict[str, Any] = {}

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        strategy = copy.deepcopy(self.user_defined_strategy)  # the user's stays as given
        _check_world(strategy, self._role_maker)
        apply_hybrid(strategy, self._role_maker._worker_num())
        _warn_without_effect(strategy, self._role_maker)
        merge_steps = gradient_merge.check_strategy(strategy) \
            if self._role_maker._is_collective else 0
        half_allreduce = fp16_allreduce.check_strategy(strategy)
        context: dict[str, Any] = {"user_defined_strategy": strategy,
                                   "user_defined_optimizer": self.user_defined_optimizer,
                                   "role_maker": self._role_maker}
        classes = self._meta_optimizer_classes
        candidates = MetaOptimizerFactory()._get_valid_meta_optimizers(
            self.user_defined_optimizer,
            meta_optimizers.META_OPTIMIZER_CLASSES if classes is None else classes)
        if strategy._is_strict_auto():
            for opt in candidates:
                opt._enable_strategy(strategy, context)
        meta_list, graph_list = self._recall(candidates, loss, strategy)
        compiler = StrategyCompiler()
        meta, graph = compiler.generate_optimizer(
            loss, self._role_maker, self.user_defined_optimizer, strategy, meta_list, graph_list)
        chosen = compiler._meta_optimizers + compiler._graph_optimizers
        context["valid_strategy"] = _valid_strategy(
            strategy, [opt for opt in candidates if not any(opt is c for c in chosen)])
        context["applied_meta_list"] = ["GradientMergeOptimizer"] * bool(merge_steps) \
            + compiler._get_applied_meta_list()
        context["applied_graph_list"] = compiler._get_applied_graph_list()
        self._context = context
        log.info("[rank %d] fleet: applied meta optimizers %s; strategy: %s",
                 self._role_maker._worker_index(), context["applied_meta_list"],
                 ", ".join(context["valid_strategy"]._settings()) or "all defaults")
        result = self._run(meta, graph, loss, startup_program, parameter_list, no_grad_set)
        startup = startup_program if startup_program is not None \
            else default_startup_program()
        _after_chain(strategy, loss.block.program, startup, merge_steps, half_allreduce)
        return result

    def _recall(self, candidates: list[MetaOptimizerBase], loss, strategy: DistributedStrategy,
                ) -> tuple[list[MetaOptimizerBase], list[MetaOptimizerBase]]:
        """The applicable candidates: (meta-optimizers, graph optimizers)."""
        rm = self._role_maker
        for opt in candidates:
            opt._set_basic_info(loss, rm, self.user_defined_optimizer, strategy)
        if rm._is_non_distributed() and not rm._is_collective:
            # Paddle compiles a chain here too but then runs the plain optimizer; applying
            # none keeps the applied list and the final strategy truthful.
            return [], []
        applicable = [opt for opt in candidates if opt._can_apply()]
        return ([opt for opt in applicable if not opt._is_graph_out()],
                [opt for opt in applicable if opt._is_graph_out()])

    def _run(self, meta, graph, loss, startup_program, parameter_list, no_grad_set):
        args = (startup_program, parameter_list, no_grad_set)
        if meta is None:
            result = self.user_defined_optimizer.minimize(loss, *args)
        else:
            # Passes of the chain read the default main program: make it the loss's program
            # while they run (Paddle switches it for good; ringflow restores the caller's).
            with program_guard(loss.block.program):
                result = meta.minimize(loss, *args)
        if graph is not None:
            # a graph optimizer rewrites what the chain built; the chain's result stands
            graph.minimize(loss, *args)
        return result

    def _get_applied_meta_list(self) -> list[str]:
        return list(self._context.get("applied_meta_list", []))

    def _get_applied_graph_list(self) -> list[str]:
        return list(self._context.get("applied_graph_list", []))

    def _final_strategy(self) -> DistributedStrategy | None:
        """The strategy after ``minimize``: features of unapplied meta-optimizers disabled."""
        return self._context.get("valid_strategy")


def _after_chain(strategy: DistributedStrategy, main, startup, merge_steps: int,
                 half_allreduce: bool) -> None:
    """What fleet does to the programs the chain built: the BuildStrategy the main program
    runs with, the rings' all-reduce in two levels or one (when the script set
    use_hierarchical_allreduce), float16 gradient all-reduces, gradient merge."""
    build_strategy = strategy._effective_build_strategy()
    if build_strategy != DEFAULT_BUILD_STRATEGY:
        main.build_strategy = build_strategy
    if "use_hierarchical_allreduce" in strategy._assigned:
        # the script chose: two levels where a host has several ranks of a ring, or one ring
        for op in startup.global_block().ops:
            if op.type == "c_comm_init":
                op._set_attr("use_hierarchical_allreduce",
                             int(strategy.use_hierarchical_allreduce))
    if half_allreduce:
        fp16_allreduce.apply(main.global_block())
    if merge_steps:
        gradient_merge.apply(main.global_block(), startup.global_block(), merge_steps,
                             strategy.gradient_merge_configs["avg"])


def _check_world(strategy: DistributedStrategy, role_maker: RoleMakerBase) -> None:
    """What the strategy asks that this world cannot run, as a ConfigError: pipeline
    parallelism over several ranks, hybrid degrees whose product is not the world."""
    world = role_maker._worker_num()
    if strategy.pipeline and world > 1:
        raise ConfigError(f"strategy.pipeline=True with {world} ranks: pipeline parallelism is "
                          "not supported by ringflow (tensor parallelism, data parallelism "
                          "and sharding are)")
    hybrid_degrees(strategy, world)


def _warn_without_effect(strategy: DistributedStrategy, role_maker: RoleMakerBase) -> None:
    """One warning (rank 0, once per process) naming each option set to a value other
    than its default that ringflow gives no effect."""
    names = [n for n in strategy._set_without_effect() if n not in _warned_without_effect]
    if not names or role_maker._worker_index() != 0:
        return
    _warned_without_effect.update(names)
    log.warning("[rank 0] fleet: DistributedStrategy options set that have no effect in "
                "ringflow (accepted for Paddle compatibility): %s", ", ".join(names))


def _valid_strategy(strategy: DistributedStrategy,
                    left_out: list[MetaOptimizerBase]) -> DistributedStrategy:
    """A copy of ``strategy`` with the feature of every candidate left out (not applicable
    or not chosen) disabled."""
    valid = copy.deepcopy(strategy)
    for opt in left_out:
        opt._disable_strategy(valid)
    return valid


class Fleet:
    """The state behind the module-level fleet API: the role maker, the strategy given so far
    and the last distributed optimizer."""

    def __init__(self) -> None:
        self._role_maker: RoleMakerBase | None = None
        self._is_collective = False
        self._user_defined_strategy: DistributedStrategy | None = None
        self._optimizer: DistributedOptimizer | None = None

    def init(self, role_maker: RoleMakerBase | None = None, is_collective: bool = False,
             strategy: DistributedStrategy | None = None) -> None:
        """Read who this process is (the env contract, unless ``role_maker`` says) and
        remember ``strategy``. Opens no connection; calling it again starts over."""
        if strategy is not None and not isinstance(strategy, DistributedStrategy):
            raise ConfigError(f"fleet.init: strategy must be a DistributedStrategy, got "
                              f"{type(strategy).__name__}")
        if role_maker is None:
            role_maker = PaddleCloudRoleMaker(is_collective=is_collective)
        elif not isinstance(role_maker, RoleMakerBase):
            raise ConfigError(f"fleet.init: role_maker must be a role maker such as "
                              f"PaddleCloudRoleMaker, got {type(role_maker).__name__}")
        role_maker._generate_role()  # a bad env fails here, not at minimize
        if strategy is not None:
            _check_world(strategy, role_maker)
        self._role_maker = role_maker
        self._is_collective = role_maker._is_collective
        self._user_defined_strategy = copy.deepcopy(strategy)
        self._optimizer = None
        log.info("[rank %d] fleet: worker %d of %d (collective=%s)", role_maker._worker_index(),
                 role_maker._worker_index(), role_maker._worker_num(), self._is_collective)

    def is_initialized(self) -> bool:
        return self._role_maker is not None

    def _initialised(self) -> RoleMakerBase:
        if self._role_maker is None:
            raise ConfigError("fleet is not initialised: call "
                              "ringflow.distributed.fleet.init() first")
        return self._role_maker

    def worker_index(self) -> int:
        return self._initialised()._worker_index()

    def worker_num(self) -> int:
        return self._initialised()._worker_num()

    def node_num(self) -> int:
        return self._initialised()._node_num()

    def is_worker(self) -> bool:
        return self._initialised()._is_worker()

    def is_first_worker(self) -> bool:
        return self._initialised()._is_first_worker()

    def worker_endpoints(self, to_string: bool = False) -> list[str] | str:
        endpoints = self._initialised()._get_trainer_endpoints()
        return ",".join(endpoints) if to_string else endpoints

    def barrier_worker(self) -> None:
        """Wait until every worker has called it. The one fleet call that connects: it joins
        the collective API's world (ring 100) on first use; a world of one returns at once."""
        rm = self._initialised()
        if rm._worker_num() == 1:
            return
        world = collective.init_parallel_env()
        if (world.nranks, world.rank) != (rm._worker_num(), rm._worker_index()):
            raise ConfigError(f"fleet's role maker says rank {rm._worker_index()} of "
                              f"{rm._worker_num()}, but the env contract's collective world "
                              f"says rank {world.rank} of {world.nranks}")
        collective.barrier()

    def distributed_optimizer(self, optimizer: Any, strategy: DistributedStrategy | None = None,
                              ) -> DistributedOptimizer:
        """Wrap ``optimizer``; ``strategy`` (if given) replaces the one given to ``init``."""
        rm = self._initialised()
        if not callable(getattr(optimizer, "minimize", None)):
            raise ConfigError(f"fleet.distributed_optimizer: {type(optimizer).__name__} is not "
                              "an optimizer (it has no minimize)")
        if strategy is not None:
            if not isinstance(strategy, DistributedStrategy):
                raise ConfigError(f"fleet.distributed_optimizer: strategy must be a "
                                  f"DistributedStrategy, got {type(strategy).__name__}")
            if self._user_defined_strategy not in (None, strategy):
                log.warning("[rank %d] fleet: the strategy given to distributed_optimizer "
                            "replaces the different one given to fleet.init",
                            rm._worker_index())
            self._user_defined_strategy = copy.deepcopy(strategy)
        chosen = self._user_defined_strategy or DistributedStrategy()
        self._optimizer = DistributedOptimizer(optimizer, copy.deepcopy(chosen), rm)
        return self._optimizer

    def get_strategy(self) -> DistributedStrategy | None:
        """A copy of the strategy given so far (None if none was given)."""
        return copy.deepcopy(self._user_defined_strategy)

    def _get_applied_meta_list(self) -> list[str]:
        return self._optimizer._get_applied_meta_list() if self._optimizer else []

    def _get_applied_graph_list(self) -> list[str]:
        return self._optimizer._get_applied_graph_list() if self._optimizer else []

    def _final_strategy(self) -> DistributedStrategy | None:
        return self._optimizer._final_strategy() if self._optimizer else None


_fleet = Fleet()

init = _fleet.init
is_initialized = _fleet.is_initialized
worker_index = _fleet.worker_index
worker_num = _fleet.worker_num
node_num = _fleet.node_num
is_worker = _fleet.is_worker
is_first_worker = _fleet.is_first_worker
worker_endpoints = _fleet.worker_endpoints
barrier_worker = _fleet.barrier_worker
distributed_optimizer = _fleet.distributed_optimizer
get_strategy = _fleet.get_strategy
_get_applied_meta_list = _fleet._get_applied_meta_list
_get_applied_graph_list = _fleet._get_applied_graph_list
_final_strategy = _fleet._final_strategy


def _role_maker() -> RoleMakerBase | None:
    """The role maker of the last ``init`` (None before), for parallel layers."""
    return _fleet._role_maker
