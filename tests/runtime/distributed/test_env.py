"""The worker env contract (DESIGN.md section 3) as the collectives read it."""

from __future__ import annotations

import pytest

from ringflow.distributed.env import Endpoint, comm_settings, worker_env
from ringflow.errors import ConfigError

BASE = {"PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "4",
        "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171",
        "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6170", "PADDLE_RANK_IN_NODE": "0",
        "RINGFLOW_JOB_ID": "job1", "RINGFLOW_JOB_TOKEN": "s3cret"}


def test_per_rank_endpoints_are_taken_as_listed():
    env = worker_env(BASE)
    assert env.rank == 2 and env.world_size == 4
    assert env.endpoint == Endpoint("10.0.0.2", 6170)
    assert env.job_id == "job1" and "s3cret" not in repr(env)


def test_per_host_endpoints_give_each_rank_the_host_port_plus_its_local_rank():
    env = worker_env({**BASE, "PADDLE_TRAINER_ID": "3", "PADDLE_RANK_IN_NODE": "1",
                      "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:7000,10.0.0.2:7000",
                      "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:7000", "PADDLE_LOCAL_SIZE": "2"})
    assert [str(e) for e in env.endpoints] == ["10.0.0.1:7000", "10.0.0.1:7001",
                                               "10.0.0.2:7000", "10.0.0.2:7001"]
    assert env.endpoint == Endpoint("10.0.0.2", 7001)


def test_per_host_ports_past_65535_are_a_config_error_naming_the_endpoint():
    env = {**BASE, "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:65535,10.0.0.2:65535",
           "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:65535", "PADDLE_LOCAL_SIZE": "2"}
    with pytest.raises(ConfigError) as err:
        worker_env(env)  # not an OverflowError from bind() in every rank
    assert str(err.value) == ("PADDLE_TRAINER_ENDPOINTS: host endpoint 10.0.0.1:65535 with 2 "
                              "ranks per host gives ports 65535..65536, beyond 65535")


def test_per_host_style_needs_the_local_rank():
    env = {**BASE, "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:7000,10.0.0.2:7000"}
    del env["PADDLE_RANK_IN_NODE"]
    with pytest.raises(ConfigError, match="PADDLE_RANK_IN_NODE"):
        worker_env(env)


def test_per_host_style_rejects_a_local_rank_that_contradicts_the_rank():
    env = {**BASE, "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:7000,10.0.0.2:7000",
           "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:7000", "PADDLE_RANK_IN_NODE": "1"}
    with pytest.raises(ConfigError, match="PADDLE_CURRENT_ENDPOINT"):
        worker_env(env)  # rank 2 is local rank 0 of host 2, not local rank 1


@pytest.mark.parametrize("var,value", [("PADDLE_TRAINER_ID", None), ("PADDLE_TRAINER_ID", "x"),
                                       ("PADDLE_TRAINER_ID", "4"), ("PADDLE_TRAINERS_NUM", "0"),
                                       ("PADDLE_TRAINER_ENDPOINTS", None),
                                       ("PADDLE_TRAINER_ENDPOINTS", "10.0.0.1"),
                                       ("PADDLE_TRAINER_ENDPOINTS", "a:1,b:2,c:3"),
                                       ("RINGFLOW_JOB_ID", None), ("RINGFLOW_JOB_ID", "a-b"),
                                       ("RINGFLOW_JOB_TOKEN", None)])
def test_missing_or_invalid_variables_raise_config_error_naming_them(var, value):
    env = dict(BASE)
    if value is None:
        env.pop(var)
    else:
        env[var] = value
    with pytest.raises(ConfigError, match=var) as info:
        worker_env(env)
    assert "s3cret" not in str(info.value)


def test_comm_settings_defaults_and_overrides():
    assert comm_settings({}).comm_timeout == 300 and comm_settings({}).rendezvous_timeout == 120
    s = comm_settings({"RINGFLOW_COMM_TIMEOUT": "7", "RINGFLOW_TRANSPORT": "TCP",
                       "RINGFLOW_HEARTBEAT_TIMEOUT": "2.5"})
    assert (s.comm_timeout, s.transport, s.heartbeat_timeout) == (7, "tcp", 2.5)
    with pytest.raises(ConfigError, match="RINGFLOW_COMM_TIMEOUT"):
        comm_settings({"RINGFLOW_COMM_TIMEOUT": "-1"})
    with pytest.raises(ConfigError, match="RINGFLOW_TRANSPORT"):
        comm_settings({"RINGFLOW_TRANSPORT": "ib"})


def test_two_level_all_reduce_is_on_unless_turned_off():
    assert comm_settings({}).two_level is True
    assert comm_settings({"RINGFLOW_TWO_LEVEL": "0"}).two_level is False
    assert comm_settings({"RINGFLOW_TWO_LEVEL": "1"}).two_level is True
    with pytest.raises(ConfigError, match="RINGFLOW_TWO_LEVEL='maybe'"):
        comm_settings({"RINGFLOW_TWO_LEVEL": "maybe"})


def test_the_one_round_size_follows_the_ranks_unless_set():
    s = comm_settings({})
    assert [s.one_round_bytes(n) for n in (2, 3, 4)] == [1 << 20, 512 << 10, 512 << 10]
    s = comm_settings({"RINGFLOW_SHM_SMALL_BYTES": "1024"})
    assert [s.one_round_bytes(n) for n in (2, 4)] == [1024, 1024]
