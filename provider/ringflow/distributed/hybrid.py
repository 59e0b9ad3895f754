"""``hybrid_configs`` (how Paddle 2.x/3.x scripts set degrees) mapped onto what ringflow runs:
``mp_degree`` is tensor parallelism, ``sharding_degree`` fleet's sharding over the
data-parallel ranks, ``dp_degree`` (-1: inferred from the world) plain data parallelism.
Pipeline, sequence/context and expert parallelism are not supported: a degree > 1 of any is
a ConfigError. Ranks are laid out as Paddle's default order (dp outermost, mp innermost):
mp groups are contiguous blocks of ranks."""

from __future__ import annotations

from dataclasses import dataclass

from ringflow.distributed.strategy import DistributedStrategy
from ringflow.errors import ConfigError

_UNSUPPORTED = {"pp_degree": "pipeline parallelism", "sep_degree": "sequence parallelism",
                "cp_degree": "context parallelism", "ep_degree": "expert parallelism",
                "moe_sharding_degree": "expert sharding",
                "cp_sharding_degree": "context-parallel sharding"}


@dataclass(frozen=True)
class Degrees:
    dp: int
    mp: int
    sharding: int


def hybrid_degrees(strategy: DistributedStrategy, world: int) -> Degrees | None:
    """The degrees ``hybrid_configs`` asks for in a world of ``world`` ranks (None when no
    hybrid_configs were given), checked: their product is the world."""
    if not strategy._given["hybrid_configs"]:
        return None
    configs = strategy.hybrid_configs
    for key, what in _UNSUPPORTED.items():
        if configs[key] > 1:
            raise ConfigError(f"hybrid_configs['{key}']={configs[key]}: {what} is not "
                              "supported by ringflow (tensor parallelism: mp_degree, data "
                              "parallelism: dp_degree, sharding: sharding_degree)")
    mp, sharding, dp = configs["mp_degree"], configs["sharding_degree"], configs["dp_degree"]
    if dp == -1:
        if world % (mp * sharding):
            raise ConfigError(f"hybrid_configs: mp_degree={mp} x sharding_degree={sharding} "
                              f"does not divide the world size {world}")
        dp = world // (mp * sharding)
    if dp * mp * sharding != world:
        raise ConfigError(f"hybrid_configs: dp_degree={dp} x mp_degree={mp} x "
                          f"sharding_degree={sharding} = {dp * mp * sharding} must be the "
                          f"world size {world}")
    if sharding > 1 and dp > 1:
        raise ConfigError(f"hybrid_configs: dp_degree={dp} with sharding_degree={sharding}: "
                          "ringflow's sharding groups are all the data-parallel ranks; give "
                          f"sharding_degree={dp * sharding} and dp_degree=1")
    _check_order(strategy.hybrid_parallel_order, Degrees(dp, mp, sharding))
    return Degrees(dp, mp, sharding)


def _check_order(order: list[str], degrees: Degrees) -> None:
    """mp must be inside dp and sharding when both are > 1 (mp groups are contiguous rank
    blocks here; Paddle's order lists axes outermost first)."""
    if degrees.mp == 1 or "mp" not in order:
        return
    for axis, degree in (("dp", degrees.dp), ("sharding", degrees.sharding)):
        if degree > 1 and axis in order and order.index(axis) > order.index("mp"):
            raise ConfigError(f"hybrid_parallel_order {order}: '{axis}' inside 'mp' is not "
                              "supported (ringflow's mp groups are contiguous blocks of ranks: "
                              "mp must come after dp and sharding)")


def apply_hybrid(strategy: DistributedStrategy, world: int) -> None:
    """Turn ``hybrid_configs`` of ``strategy`` into the options fleet's meta-optimizers read
    (tensor_parallel with its degree, sharding with its degree and mp_degree); a different
    degree given by those options too is a ConfigError."""
    degrees = hybrid_degrees(strategy, world)
    if degrees is None:
        return
    if strategy.tensor_parallel:
        given = strategy.tensor_parallel_configs["tensor_parallel_degree"]
        if given != degrees.mp:
            raise ConfigError(f"hybrid_configs['mp_degree']={degrees.mp} differs from "
                              f"tensor_parallel_configs['tensor_parallel_degree']={given}")
    if degrees.sharding > 1:
        if strategy._was_given("sharding_configs", "sharding_degree") and \
                strategy.sharding_configs["sharding_degree"] != degrees.sharding:
            raise ConfigError(f"hybrid_configs['sharding_degree']={degrees.sharding} differs "
                              f"from sharding_configs['sharding_degree']="
                              f"{strategy.sharding_configs['sharding_degree']}")
        strategy.sharding = True
        strategy.sharding_configs = {"sharding_degree": degrees.sharding,
                                     "mp_degree": degrees.mp}
    elif degrees.mp > 1:
        strategy.tensor_parallel = True
        strategy.tensor_parallel_configs = {"tensor_parallel_degree": degrees.mp}
