"""Role makers read the worker env contract (or the user's arguments) on first use, give one
endpoint per rank, and name the variable that is wrong. No test here opens a connection."""

from __future__ import annotations

import pytest

from ringflow.distributed.role_maker import PaddleCloudRoleMaker, Role, UserDefinedRoleMaker
from ringflow.errors import ConfigError

PER_RANK = {"PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "4",
            "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171",
            "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6170", "PADDLE_TRAINING_ROLE": "TRAINER"}
PER_HOST = {"PADDLE_TRAINER_ID": "3", "PADDLE_TRAINERS_NUM": "4",
            "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:7000,10.0.0.2:7000",
            "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:7000", "PADDLE_RANK_IN_NODE": "1",
            "PADDLE_LOCAL_SIZE": "2"}


def role(environ, is_collective=True):
    return PaddleCloudRoleMaker(is_collective=is_collective, environ=environ)


def test_without_any_variable_the_world_is_one_process_at_paddles_default_endpoint():
    rm = role({})
    assert (rm._worker_index(), rm._worker_num(), rm._role_id(), rm._node_num()) == (0, 1, 0, 1)
    assert rm._get_trainer_endpoints() == ["127.0.0.1:6170"]
    assert rm._get_current_endpoint() == "127.0.0.1:6170"
    assert rm._is_non_distributed() is True and rm._is_first_worker() is True


def test_per_rank_endpoints_are_read_as_listed():
    rm = role(PER_RANK)
    assert (rm._worker_index(), rm._worker_num(), rm._node_num()) == (2, 4, 2)
    assert rm._get_trainer_endpoints() == PER_RANK["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert rm._get_current_endpoint() == "10.0.0.2:6170"
    assert rm._is_non_distributed() is False and rm._is_first_worker() is False


def test_per_host_endpoints_expand_to_one_per_rank_at_port_plus_local_rank():
    rm = role(PER_HOST)
    assert rm._worker_num() == 4  # Paddle's role maker would say 2 (pitfall 4)
    assert rm._get_trainer_endpoints() == ["10.0.0.1:7000", "10.0.0.1:7001",
                                           "10.0.0.2:7000", "10.0.0.2:7001"]
    assert rm._get_current_endpoint() == "10.0.0.2:7001"
    assert rm._node_num() == 2


def test_per_host_endpoints_without_a_local_size_split_the_world_evenly():
    env = {k: v for k, v in PER_HOST.items() if k != "PADDLE_LOCAL_SIZE"}
    assert role(env)._get_trainer_endpoints()[1] == "10.0.0.1:7001"


def test_without_trainers_num_the_world_is_one_rank_per_endpoint():
    env = {k: v for k, v in PER_RANK.items() if k != "PADDLE_TRAINERS_NUM"}
    assert role(env)._worker_num() == 4


def test_the_environment_is_read_on_first_use_not_when_built():
    environ = {"PADDLE_TRAINER_ID": "9"}
    rm = role(environ)  # an invalid rank, not yet read
    environ.update(PER_RANK)
    assert rm._worker_index() == 2


def test_the_environment_is_read_once():
    environ = dict(PER_RANK)
    rm = role(environ)
    assert rm._worker_index() == 2
    environ["PADDLE_TRAINER_ID"] = "3"
    assert rm._worker_index() == 2


def test_a_training_role_other_than_trainer_is_an_error():
    with pytest.raises(ConfigError, match="PADDLE_TRAINING_ROLE='PSERVER': expected TRAINER"):
        role({**PER_RANK, "PADDLE_TRAINING_ROLE": "PSERVER"})._worker_num()


@pytest.mark.parametrize("var,value", [
    ("PADDLE_TRAINER_ID", "4"), ("PADDLE_TRAINER_ID", "x"), ("PADDLE_TRAINER_ID", "-1"),
    ("PADDLE_TRAINERS_NUM", "0"), ("PADDLE_TRAINERS_NUM", "3"),
    ("PADDLE_TRAINER_ENDPOINTS", "10.0.0.1,10.0.0.2"),
    ("PADDLE_TRAINER_ENDPOINTS", "10.0.0.1:99999,10.0.0.2:1,10.0.0.3:1,10.0.0.4:1"),
    ("PADDLE_CURRENT_ENDPOINT", "10.0.0.1:6170"), ("PADDLE_CURRENT_ENDPOINT", "nohost")])
def test_an_inconsistent_variable_is_an_error_naming_it(var, value):
    with pytest.raises(ConfigError, match=var):
        role({**PER_RANK, var: value})._worker_num()


def test_a_local_rank_that_contradicts_the_rank_is_an_error():
    with pytest.raises(ConfigError, match="PADDLE_RANK_IN_NODE=0 but rank 3 is local rank 1"):
        role({**PER_HOST, "PADDLE_RANK_IN_NODE": "0"})._worker_num()


def test_a_world_of_several_needs_endpoints():
    with pytest.raises(ConfigError, match="PADDLE_TRAINERS_NUM=2 but PADDLE_TRAINER_ENDPOINTS"):
        role({"PADDLE_TRAINERS_NUM": "2"})._worker_num()


def test_is_collective_is_kept_as_given():
    assert role({}, is_collective=False)._is_collective is False
    assert role({}, is_collective=True)._is_collective is True


def test_is_collective_must_be_a_bool():
    with pytest.raises(ConfigError, match="is_collective must be a bool, got 'yes'"):
        PaddleCloudRoleMaker(is_collective="yes")


def test_an_unknown_argument_is_an_error_but_init_gloo_is_accepted():
    PaddleCloudRoleMaker(is_collective=True, init_gloo=True)
    with pytest.raises(ConfigError, match=r"unknown arguments \['env'\]"):
        PaddleCloudRoleMaker(is_collective=True, env={})


def test_a_user_defined_role_is_taken_as_given():
    rm = UserDefinedRoleMaker(is_collective=True, current_id=1, role=Role.WORKER,
                              worker_endpoints=["10.0.0.1:6170", "10.0.0.2:6170"])
    assert (rm._worker_index(), rm._worker_num(), rm._node_num()) == (1, 2, 2)
    assert rm._get_current_endpoint() == "10.0.0.2:6170"
    assert rm._is_non_distributed() is False


def test_a_user_defined_role_expands_per_host_endpoints_to_worker_num_ranks():
    rm = UserDefinedRoleMaker(is_collective=True, current_id=3, worker_num=4,
                              worker_endpoints="10.0.0.1:7000,10.0.0.2:7000")
    assert rm._get_trainer_endpoints() == ["10.0.0.1:7000", "10.0.0.1:7001",
                                           "10.0.0.2:7000", "10.0.0.2:7001"]


@pytest.mark.parametrize("kwargs,message", [
    ({"current_id": 2, "worker_endpoints": ["a:1", "b:1"]}, "current_id=2 must be <"),
    ({"worker_endpoints": []}, "worker_endpoints: give the workers' endpoints"),
    ({"worker_endpoints": ["a:1"], "role": Role.SERVER}, "only role=Role.WORKER"),
    ({"worker_endpoints": ["a"]}, "endpoint 'a' is not of the form ip:port"),
    ({"worker_endpoints": ["a:1"], "trainer_id": 0}, r"unknown arguments \['trainer_id'\]")])
def test_a_bad_user_defined_role_is_an_error_when_built(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        UserDefinedRoleMaker(is_collective=True, **kwargs)
