"""Comm errors name ranks as the user knows them: global rank and host, with the position in
the ring only in addition (a dp ring of ranks 1 and 3 has positions 0 and 1)."""

from __future__ import annotations

from ringflow.distributed.collective.communicator import _world_endpoints
from ringflow.distributed.collective.transport.base import OpContext, rank_names
from ringflow.distributed.env import Endpoint, world_endpoints
from ringflow.errors import CommError, CommTimeoutError

WORLD = [Endpoint("10.77.0.1", 6170), Endpoint("10.77.0.1", 6171),
         Endpoint("10.77.0.2", 6170), Endpoint("10.77.0.2", 6171)]


def test_a_ring_member_is_named_by_global_rank_and_host_with_its_ring_position():
    dp_ring = [WORLD[1], WORLD[3]]
    assert rank_names(2, dp_ring, WORLD) == (
        "rank 1 on 10.77.0.1 (position 0 in ring 2)",
        "rank 3 on 10.77.0.2 (position 1 in ring 2)")
    # where positions are the global ranks, nothing is added
    assert rank_names(1, WORLD, WORLD)[2] == "rank 2 on 10.77.0.2"


def test_without_the_world_a_ring_position_is_the_rank():
    assert rank_names(100, ["127.0.0.1:5000", "127.0.0.2:5001"], None) == (
        "rank 0 on 127.0.0.1", "rank 1 on 127.0.0.2")


def test_the_error_names_this_rank_and_the_silent_peer_globally():
    ctx = OpContext(0, 2, "all_reduce", host="10.77.0.1:6171",
                    names=rank_names(2, [WORLD[1], WORLD[3]], WORLD))
    err = ctx.error(1, f"no heartbeat from {ctx.name(1)} for 20 s", timeout=False)
    assert type(err) is CommError
    assert str(err) == (
        "rank 1 on 10.77.0.1 (position 0 in ring 2): all_reduce on ring 2 failed with peer "
        "rank 3 on 10.77.0.2 (position 1 in ring 2): no heartbeat from rank 3 on 10.77.0.2 "
        "(position 1 in ring 2) for 20 s")
    assert isinstance(ctx.error(None, "deadline", timeout=True), CommTimeoutError)


def test_the_world_comes_from_the_launchers_env_in_either_form(monkeypatch):
    per_rank = {"PADDLE_TRAINERS_NUM": "4",
                "PADDLE_TRAINER_ENDPOINTS": ",".join(str(e) for e in WORLD)}
    per_host = {"PADDLE_TRAINERS_NUM": "4", "PADDLE_LOCAL_SIZE": "2",
                "PADDLE_TRAINER_ENDPOINTS": "10.77.0.1:6170,10.77.0.2:6170"}
    assert world_endpoints(per_rank) == tuple(WORLD) == world_endpoints(per_host)
    for name in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert _world_endpoints() is None  # a ring made by hand: positions name the ranks
    for name, value in per_host.items():
        monkeypatch.setenv(name, value)
    assert _world_endpoints() == tuple(WORLD)
