"""DistributedStrategy: merge semantics, checked values, strict auto, deep copies and the
readable listing (Paddle's options and defaults one by one: test_strategy_paddle.py)."""

from __future__ import annotations

import copy

import pytest

from ringflow.distributed.strategy import DistributedStrategy
from ringflow.errors import ConfigError


def test_configs_assignment_merges_only_the_keys_given():
    s = DistributedStrategy()
    s.tensor_parallel_configs = {"tensor_parallel_degree": 2}
    s.tensor_parallel_configs = {"tensor_init_seed": 7}
    assert s.tensor_parallel_configs == {"tensor_parallel_degree": 2, "tensor_init_seed": 7}


def test_assigning_an_empty_dict_changes_nothing():
    s = DistributedStrategy()
    s.tensor_parallel_configs = {"tensor_parallel_degree": 4}
    s.tensor_parallel_configs = {}
    assert s.tensor_parallel_configs["tensor_parallel_degree"] == 4


def test_the_configs_getter_returns_a_copy():
    s = DistributedStrategy()
    s.tensor_parallel_configs["tensor_parallel_degree"] = 8
    s.recompute_configs["checkpoints"].append("x")
    assert s.tensor_parallel_configs["tensor_parallel_degree"] == 1
    assert s.recompute_configs["checkpoints"] == []


def test_an_unknown_config_key_is_named_with_the_known_ones():
    s = DistributedStrategy()
    with pytest.raises(ConfigError) as info:
        s.tensor_parallel_configs = {"mp_degree": 2}
    assert str(info.value) == ("tensor_parallel_configs: unknown key 'mp_degree'; known keys: "
                               "tensor_parallel_degree, tensor_init_seed")


def test_a_rejected_configs_assignment_changes_no_key():
    s = DistributedStrategy()
    with pytest.raises(ConfigError):
        s.tensor_parallel_configs = {"tensor_parallel_degree": 4, "tensor_init_seed": "x"}
    assert s.tensor_parallel_configs["tensor_parallel_degree"] == 1


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_non_bool_feature_flag_is_an_error_naming_the_value(value):
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match=f"tensor_parallel must be a bool, got {value!r}"):
        s.tensor_parallel = value
    assert s.tensor_parallel is False


@pytest.mark.parametrize("degree,message", [
    (0, "must be >= 1, got 0"), (-2, "must be >= 1, got -2"),
    ("2", "must be an int, got '2'"), (2.0, "must be an int, got 2.0"),
    (True, "must be an int, got True")])
def test_the_degree_must_be_an_int_of_at_least_one(degree, message):
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match="tensor_parallel_configs\\['tensor_parallel_degree'\\] "
                                          + message):
        s.tensor_parallel_configs = {"tensor_parallel_degree": degree}


def test_a_float_field_takes_an_int_and_stores_a_float():
    s = DistributedStrategy()
    s.amp_configs = {"init_loss_scaling": 1024}
    value = s.amp_configs["init_loss_scaling"]
    assert value == 1024.0 and type(value) is float


def test_a_list_field_is_replaced_not_extended():
    s = DistributedStrategy()
    s.recompute_configs = {"checkpoints": ["fc_0.tmp_0"]}
    s.recompute_configs = {"checkpoints": ("fc_1.tmp_0",)}
    assert s.recompute_configs["checkpoints"] == ["fc_1.tmp_0"]


def test_a_list_field_takes_only_names():
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match="must be a list of str, got 'fc_0'"):
        s.recompute_configs = {"checkpoints": "fc_0"}


def test_configs_must_be_a_dict():
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match="tensor_parallel_configs must be a dict, got 2"):
        s.tensor_parallel_configs = 2


@pytest.mark.parametrize("name,value,message", [
    ("fuse_grad_size_in_MB", 0, ">= 1, got 0"), ("fuse_grad_size_in_MB", 1.5, "an int"),
    ("fuse_all_reduce_ops", "no", "a bool"), ("auto", 1, "a bool")])
def test_plain_options_are_type_checked(name, value, message):
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match=f"{name} must be {message}"):
        setattr(s, name, value)


def test_setting_an_unknown_option_is_an_error_naming_it():
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match="no option 'tensor_paralel'; options: amp, recompute, "):
        s.tensor_paralel = True


def test_auto_alone_is_strict_auto():
    s = DistributedStrategy()
    s.auto = True
    assert s._is_strict_auto() is True


def test_auto_with_any_other_option_set_is_not_strict_auto():
    s = DistributedStrategy()
    s.auto = True
    s.fuse_grad_size_in_MB = 32  # even the default value counts as set, as in Paddle
    assert s._is_strict_auto() is False


def test_strict_auto_is_per_strategy():
    touched, untouched = DistributedStrategy(), DistributedStrategy()
    touched.amp = True
    untouched.auto = True
    assert untouched._is_strict_auto() is True  # Paddle's module-global flag would say False


def test_a_deep_copy_is_equal_and_independent():
    s = DistributedStrategy()
    s.tensor_parallel = True
    s.recompute_configs = {"checkpoints": ["a"]}
    c = copy.deepcopy(s)
    c.recompute_configs = {"checkpoints": ["b"]}
    c.tensor_parallel = False
    assert s.recompute_configs["checkpoints"] == ["a"] and s.tensor_parallel is True
    assert copy.deepcopy(s) == s and c != s


def test_a_default_strategy_prints_as_all_defaults():
    assert str(DistributedStrategy()) == "DistributedStrategy: all defaults"


def test_printing_lists_changed_fields_and_the_configs_of_enabled_features():
    s = DistributedStrategy()
    s.tensor_parallel = True
    s.tensor_parallel_configs = {"tensor_parallel_degree": 2}
    s.amp_configs = {"init_loss_scaling": 1024.0}
    s.fuse_grad_size_in_MB = 64
    assert repr(s) == str(s) == (
        "DistributedStrategy:\n"
        "  fuse_grad_size_in_MB = 64\n"
        "  tensor_parallel = True\n"
        "  amp_configs.init_loss_scaling = 1024.0\n"
        "  tensor_parallel_configs = {'tensor_parallel_degree': 2, 'tensor_init_seed': -1}")
