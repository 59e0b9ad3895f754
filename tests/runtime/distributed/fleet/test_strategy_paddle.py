"""Paddle 3.3's ``DistributedStrategy``, option by option, as ringflow's states it.

Facts (measured on the PaddlePaddle 3.3.1 CPU wheel, ``distributed_strategy.py`` and
``distributed_strategy.proto``): 59 public options; the defaults below (float32 proto fields
read back as their nearest float, e.g. lars_coeff 0.001); a ``*_configs`` setter merges the
keys given into the current message (nested messages too) and refuses unknown keys;
``hybrid_configs["order"]`` sets ``hybrid_parallel_order``; ``a_sync`` and ``adam_d2sum``
raise ValueError for a non-bool, ``fp16_allreduce`` TypeError, ``last_comm_group_size_MB <= 0``
ValueError, an unknown attribute TypeError; ``a_sync = flag`` also sets
``a_sync_configs["k_steps"] = 0``. Every other option given a value of the wrong type keeps
its old value silently in Paddle: ringflow raises a ConfigError naming option and value
instead (on purpose; the README says so), and that ConfigError is a TypeError.
"""

from __future__ import annotations

import copy
import json
import logging

import pytest

import ringflow as rf
from ringflow.distributed import fleet
from ringflow.distributed.role_maker import UserDefinedRoleMaker
from ringflow.distributed.strategy import DistributedStrategy
from ringflow.errors import ConfigError

# the communicator options of every *_configs message that has one (Paddle's NCCLConfig)
NCCL_CONFIG = {'commName': '', 'll_buffsize': 0, 'll128_buffsize': 0, 'simple_buffsize': 0,
               'buffsize_align': 0, 'nchannels': 0, 'algoStr': '', 'protoStr': ''}
PADDLE_DEFAULTS = {'a_sync': True,
 'a_sync_configs': {'heter_worker_device_guard': 'cpu',
                    'independent_recv_thread': False,
                    'k_steps': -1,
                    'launch_barrier': True,
                    'lr_decay_steps': 10,
                    'max_merge_var_num': 1,
                    'min_send_grad_num_before_recv': 1,
                    'runtime_split_send_recv': False,
                    'send_queue_size': 16,
                    'send_wait_times': 1,
                    'thread_pool_size': 1,
                    'use_gpu_graph': 0,
                    'use_ps_gpu': 0},
 'adam_d2sum': False,
 'adaptive_localsgd': False,
 'adaptive_localsgd_configs': {'begin_step': 1, 'init_k_steps': 1},
 'amp': False,
 'amp_configs': {'custom_black_list': [],
                 'custom_black_varnames': [],
                 'custom_white_list': [],
                 'decr_every_n_nan_or_inf': 2,
                 'decr_ratio': 0.8,
                 'incr_every_n_steps': 1000,
                 'incr_ratio': 2.0,
                 'init_loss_scaling': 32768.0,
                 'use_dynamic_loss_scaling': True,
                 'use_fp16_guard': True,
                 'use_optimizer_fp16': False,
                 'use_pure_bf16': False,
                 'use_pure_fp16': False},
 'asp': False,
 'auto': False,
 'auto_search': False,
 'conv_workspace_size_limit': 512,
 'cudnn_batchnorm_spatial_persistent': False,
 'cudnn_exhaustive_search': False,
 'dgc': False,
 'dgc_configs': {'rampup_begin_step': 0, 'rampup_step': 1, 'sparsity': []},
 'elastic': False,
 'find_unused_parameters': False,
 'fleet_desc_configs': [],
 'fp16_allreduce': False,
 'fs_client_param': {'uri': '', 'user': '', 'passwd': '', 'hadoop_bin': ''},
 'fuse_all_reduce_ops': True,
 'fuse_grad_merge': False,
 'fuse_grad_size_in_MB': 32,
 'fuse_grad_size_in_num': 8,
 'gradient_merge': False,
 'gradient_merge_configs': {'avg': True, 'k_steps': 1},
 'gradient_scale_configs': {'scale_gradient': False, 'scale_strategy': 'avg'},
 'heter_ccl_mode': False,
 'hierarchical_allreduce_inter_nranks': 1,
 'hybrid_configs': {'dp_degree': -1,
                    'mp_degree': 1,
                    'pp_degree': 1,
                    'sharding_degree': 1,
                    'sep_degree': 1,
                    'mp_configs': {'sync_param': True,
                                   'sync_grad': False,
                                   'sync_moment': False,
                                   'sync_mode': 'broadcast',
                                   'mp_async_allreduce': False,
                                   'mp_skip_c_identity': False,
                                   'mp_fused_linear_param_grad_add': False,
                                   'need_broadcast_data': True,
                                   'recompute_allgather': False,
                                   'sp_async_reduce_scatter': False,
                                   'nccl_config': dict(NCCL_CONFIG)},
                    'pp_configs': {'dp_comm_overlap': False,
                                   'delay_scale_loss': False,
                                   'enable_timer': False,
                                   'sharding_comm_overlap': False,
                                   'profiling': False,
                                   'release_gradients': False,
                                   'overlap_p2p_comm': False,
                                   'clear_every_step_cache': False,
                                   'use_batch_p2p_comm': True,
                                   'best_unbalanced_scheduler': False,
                                   'enable_offload_queue': False,
                                   'enable_dynamic_shape': False,
                                   'use_dualpipev': False,
                                   'forward_backward_overlap_scheduler': False,
                                   'coll_nccl_config': dict(NCCL_CONFIG),
                                   'p2p_nccl_config': dict(NCCL_CONFIG),
                                   'shared_nccl_config': dict(NCCL_CONFIG),
                                   'sync_param': False,
                                   'sync_moment': False,
                                   'sync_mode': 'broadcast'},
                    'sharding_configs': {'tensor_fusion': False,
                                         'accumulate_steps': 1,
                                         'comm_overlap': False,
                                         'split_param': False,
                                         'fuse_optimizer': True,
                                         'use_reduce_avg': True,
                                         'comm_buffer_size_MB': 256,
                                         'release_gradients': False,
                                         'free_grads_in_comm': False,
                                         'enable_fuse_optimizer_states': False,
                                         'nccl_config': dict(NCCL_CONFIG),
                                         'check_nccl_config': dict(NCCL_CONFIG),
                                         'offload_opt_buffer_size': -1},
                    'enable_optimizer_timer': False,
                    'split_norm_comm': False,
                    'ep_degree': 1,
                    'moe_sharding_degree': 1,
                    'dp_configs': {'nccl_config': dict(NCCL_CONFIG),
                                   'check_nccl_config': dict(NCCL_CONFIG)},
                    'sep_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'dp_sep_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'pp_tp_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'ep_configs': {'nccl_config': dict(NCCL_CONFIG),
                                   'grad_nccl_config': dict(NCCL_CONFIG)},
                    'moe_sharding_configs': {'nccl_config': dict(NCCL_CONFIG),
                                             'check_nccl_config': dict(NCCL_CONFIG)},
                    'default_comm_group_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'cp_degree': 1,
                    'cp_sharding_degree': 1,
                    'cp_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'cp_sharding_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'dp_cp_configs': {'nccl_config': dict(NCCL_CONFIG)},
                    'cp_mp_configs': {'nccl_config': dict(NCCL_CONFIG)}},
 'is_fl_ps_mode': False,
 'is_with_coordinator': False,
 'lamb': False,
 'lamb_configs': {'exclude_from_weight_decay': [], 'lamb_weight_decay': 0.01},
 'lars': False,
 'lars_configs': {'epsilon': 0.0,
                  'exclude_from_weight_decay': [],
                  'lars_coeff': 0.001,
                  'lars_weight_decay': 0.0005},
 'last_comm_group_size_MB': 1.0,
 'localsgd': False,
 'localsgd_configs': {'begin_step': 1, 'k_steps': 1},
 'nccl_comm_num': 1,
 'pipeline': False,
 'pipeline_configs': {'accumulate_steps': 1,
                      'enable_partial_send_recv': True,
                      'micro_batch_size': 1,
                      'p2p_cache_shape': True,
                      'schedule_mode': '1F1B'},
 'qat': False,
 'qat_configs': {'activation_bits': 8,
                 'algo': '',
                 'channel_wise_abs_max': True,
                 'not_quant_pattern': [],
                 'weight_bits': 8},
 'recompute': False,
 'recompute_configs': {'checkpoint_shape': [],
                       'checkpoints': [],
                       'enable_offload': False,
                       'enable_tuning': False,
                       'refined_ops_patterns': []},
 'semi_auto': False,
 'sharding': False,
 'sharding_configs': {'_dp_as_optimizer_sharding': False,
                      'dp_degree': 1,
                      'enable_tuning': False,
                      'gradient_merge_acc_step': 1,
                      'hybrid_dp': False,
                      'mp_degree': 1,
                      'optimize_cast': False,
                      'optimize_offload': False,
                      'pp_allreduce_in_optimize': False,
                      'pp_degree': 1,
                      'segment_anchors': [],
                      'segment_broadcast_MB': 32.0,
                      'sharding_degree': 8,
                      'sharding_segment_strategy': 'segment_broadcast_MB',
                      'stage': 1,
                      'use_calc_stream': False},
 'sparse_table_configs': [],
 'split_data': True,
 'sync_batch_norm': False,
 'sync_nccl_allreduce': True,
 'tensor_parallel': False,
 'tensor_parallel_configs': {'tensor_init_seed': -1, 'tensor_parallel_degree': 1},
 'trainer_desc_configs': {'device_worker': '',
                          'dump_fields': [],
                          'dump_fields_path': '',
                          'dump_param': [],
                          'local_sparse': [],
                          'remote_sparse': [],
                          'stat_var_names': [],
                          'trainer': ''},
 'use_hierarchical_allreduce': False,
 'without_graph_optimization': True}

BOOLS = [n for n, v in PADDLE_DEFAULTS.items() if isinstance(v, bool)]
INTS = [n for n, v in PADDLE_DEFAULTS.items() if type(v) is int]
CONFIGS = [n for n, v in PADDLE_DEFAULTS.items() if isinstance(v, dict)]


def test_there_are_paddles_59_options_and_no_other():
    public = {n for n in dir(DistributedStrategy) if not n.startswith("_")} - {
        "save_to_prototxt", "load_from_prototxt"}
    assert public == set(PADDLE_DEFAULTS) | {"build_strategy"}
    assert len(public) == 59


@pytest.mark.parametrize("name", list(PADDLE_DEFAULTS))
def test_each_option_has_paddles_default(name):
    value = getattr(DistributedStrategy(), name)
    assert value == PADDLE_DEFAULTS[name]
    assert type(value) is type(PADDLE_DEFAULTS[name])


def test_build_strategy_defaults_to_ringflows_and_takes_one():
    s = DistributedStrategy()
    assert s.build_strategy == rf.BuildStrategy()
    s.build_strategy = rf.BuildStrategy(fuse_all_reduce_ops=False)
    assert s.build_strategy.fuse_all_reduce_ops is False
    with pytest.raises(TypeError, match="build_strategy must be a ringflow BuildStrategy"):
        s.build_strategy = {"fuse_all_reduce_ops": False}


def test_hybrid_parallel_order_and_sync_param_name_are_paddles():
    s = DistributedStrategy()
    assert s.hybrid_parallel_order == ["dp", "pp", "sharding", "sep", "cp", "mp"]
    assert s.sync_param_name == ["embedding", "layer_norm", ".b_"]


@pytest.mark.parametrize("name", BOOLS)
def test_a_bool_option_takes_a_bool(name):
    s = DistributedStrategy()
    s_value = not PADDLE_DEFAULTS[name]
    setattr(s, name, s_value)
    assert getattr(s, name) is s_value


@pytest.mark.parametrize("name", [n for n in BOOLS if n not in ("a_sync", "adam_d2sum")])
def test_a_non_bool_is_a_type_error_naming_option_and_value_where_paddle_keeps_the_old(name):
    s = DistributedStrategy()
    with pytest.raises(TypeError, match=f"^{name} must be a bool, got 'True' \\(str\\)$") as e:
        setattr(s, name, "True")
    assert isinstance(e.value, ConfigError)
    assert getattr(s, name) is PADDLE_DEFAULTS[name]


@pytest.mark.parametrize("name", ["a_sync", "adam_d2sum"])
def test_a_sync_and_adam_d2sum_raise_value_error_for_a_non_bool_as_paddle(name):
    with pytest.raises(ValueError, match=f"{name} must be a bool, got 1") as e:
        setattr(DistributedStrategy(), name, 1)
    assert isinstance(e.value, ConfigError)


def test_fp16_allreduce_raises_type_error_for_a_non_bool_as_paddle():
    with pytest.raises(TypeError, match="fp16_allreduce must be a bool"):
        DistributedStrategy().fp16_allreduce = 1


def test_setting_a_sync_sets_its_k_steps_to_0_as_paddle():
    s = DistributedStrategy()
    s.a_sync = False
    assert (s.a_sync, s.a_sync_configs["k_steps"]) == (False, 0)


@pytest.mark.parametrize("name", INTS)
def test_an_int_option_takes_an_int_and_refuses_a_float_or_bool(name):
    s = DistributedStrategy()
    setattr(s, name, 4)
    assert getattr(s, name) == 4
    for bad in (2.5, True, "4"):
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            setattr(s, name, bad)
    assert getattr(s, name) == 4


@pytest.mark.parametrize("value", [0, -1.0])
def test_last_comm_group_size_mb_at_most_0_is_a_value_error_as_paddle(value):
    s = DistributedStrategy()
    with pytest.raises(ValueError, match="last_comm_group_size_MB must be > 0") as e:
        s.last_comm_group_size_MB = value
    assert isinstance(e.value, ConfigError) and s.last_comm_group_size_MB == 1.0


def test_last_comm_group_size_mb_takes_a_fraction_as_a_float():
    s = DistributedStrategy()
    s.last_comm_group_size_MB = 2
    assert s.last_comm_group_size_MB == 2.0 and type(s.last_comm_group_size_MB) is float
    with pytest.raises(TypeError):
        s.last_comm_group_size_MB = "2"


def test_an_unknown_option_is_a_type_error_naming_it_as_paddle():
    with pytest.raises(TypeError, match="no option 'hybrid_config'; options: amp, ") as e:
        DistributedStrategy().hybrid_config = {"dp_degree": 2}
    assert isinstance(e.value, ConfigError)


@pytest.mark.parametrize("name", CONFIGS)
def test_a_configs_option_is_a_dict_of_all_fields_and_refuses_a_non_dict(name):
    s = DistributedStrategy()
    assert set(getattr(s, name)) == set(PADDLE_DEFAULTS[name])
    with pytest.raises(TypeError, match=f"{name} must be a dict, got 0"):
        setattr(s, name, 0)


@pytest.mark.parametrize("name", CONFIGS)
def test_an_unknown_configs_key_is_refused_naming_the_known_ones(name):
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match=f"^{name}: unknown key 'nope'; known keys: ") as e:
        setattr(s, name, {"nope": 1})
    assert set(str(e.value).split("known keys: ")[1].split(", ")) == set(PADDLE_DEFAULTS[name])
    assert getattr(s, name) == PADDLE_DEFAULTS[name]


def test_configs_merge_into_the_current_values_nested_messages_too():
    s = DistributedStrategy()
    s.gradient_merge_configs = {"k_steps": 4}
    s.gradient_merge_configs = {"avg": False}
    assert s.gradient_merge_configs == {"k_steps": 4, "avg": False}
    s.hybrid_configs = {"mp_degree": 2, "mp_configs": {"sync_grad": True}}
    s.hybrid_configs = {"mp_configs": {"sync_moment": True}}
    mp = s.hybrid_configs["mp_configs"]
    assert (s.hybrid_configs["mp_degree"], mp["sync_grad"], mp["sync_moment"],
            mp["sync_param"]) == (2, True, True, True)


def test_an_unknown_nested_key_is_refused_and_changes_nothing():
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match=r"hybrid_configs\['mp_configs'\]: unknown key 'x'"):
        s.hybrid_configs = {"dp_degree": 2, "mp_configs": {"x": 1}}
    assert s.hybrid_configs["dp_degree"] == -1


def test_hybrid_order_and_sync_param_name_go_where_paddle_puts_them():
    s = DistributedStrategy()
    s.hybrid_configs = {"dp_degree": 2, "order": ["dp", "pp", "sharding", "sep", "mp"],
                        "mp_configs": {"sync_param_name": ["fc"]}}
    assert s.hybrid_parallel_order == ["dp", "pp", "sharding", "sep", "mp"]
    assert s.sync_param_name == ["fc"]
    assert "order" not in s.hybrid_configs and s.hybrid_configs["dp_degree"] == 2


def test_hybrid_order_names_only_known_axes_once():
    with pytest.raises(ValueError, match=r"hybrid_configs\['order'\] must list distinct axes"):
        DistributedStrategy().hybrid_configs = {"order": ["dp", "mp", "mp"]}


def test_scale_strategy_is_avg_sum_or_customized():
    s = DistributedStrategy()
    s.gradient_scale_configs = {"scale_strategy": "sum"}
    assert s.gradient_scale_configs["scale_strategy"] == "sum"
    with pytest.raises(ValueError, match="must be one of avg, sum, customized, got 'mean'"):
        s.gradient_scale_configs = {"scale_strategy": "mean"}


def test_a_repeated_message_field_takes_a_list_of_messages():
    s = DistributedStrategy()
    s.recompute_configs = {"refined_ops_patterns": [{"main_ops": ["matmul_v2"], "num": 2}]}
    assert s.recompute_configs["refined_ops_patterns"] == [
        {"main_ops": ["matmul_v2"], "num": 2, "pre_ops": [], "suf_ops": []}]


def test_parameter_server_tables_are_kept_as_given():
    s = DistributedStrategy()
    s.sparse_table_configs = {"emb": {"table_parameters.emb.shard_num": 10}}
    assert s.sparse_table_configs == {"emb": {"table_parameters.emb.shard_num": 10}}
    with pytest.raises(TypeError):
        s.fleet_desc_configs = "x"


def test_printing_lists_every_option_set():
    s = DistributedStrategy()
    s.gradient_merge = True
    s.hybrid_configs = {"mp_degree": 2, "order": ["dp", "sharding", "pp", "sep", "cp", "mp"]}
    s.nccl_comm_num = 2
    assert str(s) == (
        "DistributedStrategy:\n"
        "  gradient_merge = True\n"
        "  nccl_comm_num = 2\n"
        "  hybrid_configs.mp_degree = 2\n"
        "  gradient_merge_configs = {'k_steps': 1, 'avg': True}\n"
        "  hybrid_parallel_order = ['dp', 'sharding', 'pp', 'sep', 'cp', 'mp']")


def _every_option_changed() -> DistributedStrategy:
    s = DistributedStrategy()
    for name, default in PADDLE_DEFAULTS.items():
        if isinstance(default, bool):
            setattr(s, name, not default)
        elif isinstance(default, (int, float)):
            setattr(s, name, default + 3)
    s.amp_configs = {"custom_white_list": ["matmul_v2"], "decr_ratio": 0.5}
    s.hybrid_configs = {"dp_degree": 2, "mp_configs": {"nccl_config": {"commName": "x"}},
                        "order": ["pp", "dp", "sharding", "sep", "cp", "mp"]}
    s.recompute_configs = {"refined_ops_patterns": [{"main_ops": ["a"], "num": 1}]}
    s.sparse_table_configs = {"emb": {"table_parameters.emb.shard_num": 10}}
    s.build_strategy = rf.BuildStrategy(fuse_grad_size_in_MB=4.0, overlap_comm=False)
    return s


def test_save_to_prototxt_and_load_from_prototxt_round_trip_every_option(tmp_path):
    s = _every_option_changed()
    s.save_to_prototxt(tmp_path / "strategy.prototxt")
    loaded = DistributedStrategy()
    loaded.load_from_prototxt(str(tmp_path / "strategy.prototxt"))
    assert loaded == s
    for name in [*PADDLE_DEFAULTS, "build_strategy", "hybrid_parallel_order"]:
        assert getattr(loaded, name) == getattr(s, name), name


def test_load_from_prototxt_merges_the_options_the_file_names(tmp_path):
    path = tmp_path / "s.prototxt"
    DistributedStrategy().save_to_prototxt(path)
    document = json.loads(path.read_text())
    document["options"] = {"gradient_merge_configs": {"k_steps": 8}}
    path.write_text(json.dumps(document))
    s = DistributedStrategy()
    s.gradient_merge_configs = {"avg": False}
    s.amp = True
    s.load_from_prototxt(path)
    assert (s.gradient_merge_configs, s.amp) == ({"k_steps": 8, "avg": False}, True)


def test_load_from_prototxt_refuses_a_bad_value_and_changes_nothing(tmp_path):
    path = tmp_path / "s.prototxt"
    path.write_text(json.dumps({"format": "ringflow.DistributedStrategy/1", "options": {
        "amp": True, "nccl_comm_num": "two"}}))
    s = DistributedStrategy()
    with pytest.raises(ConfigError, match="nccl_comm_num must be an int"):
        s.load_from_prototxt(path)
    assert s == DistributedStrategy()


def test_a_deep_copy_of_every_option_is_equal_and_independent():
    s = _every_option_changed()
    c = copy.deepcopy(s)
    assert c == s
    c.hybrid_configs = {"mp_configs": {"sync_grad": True}}
    assert c != s


def test_options_without_effect_are_the_ones_set_that_ringflow_ignores():
    s = DistributedStrategy()
    s.tensor_parallel = True
    s.cudnn_exhaustive_search = True
    s.nccl_comm_num = 1      # Paddle's default: not "set"
    s.sync_batch_norm = True
    assert s._set_without_effect() == ["sync_batch_norm", "cudnn_exhaustive_search"]


# fleet -------------------------------------------------------------------------------------
def _two_ranks(rank=0):
    fleet.init(role_maker=UserDefinedRoleMaker(
        is_collective=True, current_id=rank, worker_endpoints=["10.0.0.1:6170",
                                                                "10.0.0.2:6170"]))


def _minimize(strategy):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 4], dtype="float32")
        loss = rf.nn.mean(rf.nn.fc(x, 3))
        fleet.distributed_optimizer(rf.optimizer.SGD(0.1), strategy).minimize(loss)
    return main


def test_fleet_warns_once_per_job_naming_each_option_without_effect(caplog, monkeypatch):
    monkeypatch.setattr(fleet, "_warned_without_effect", set())
    _two_ranks()
    s = DistributedStrategy()
    s.sync_batch_norm = True
    s.dgc = True
    with caplog.at_level(logging.WARNING, logger="ringflow.distributed"):
        _minimize(s)
        _minimize(s)
    warnings = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert warnings == ["[rank 0] fleet: DistributedStrategy options set that have no effect "
                        "in ringflow (accepted for Paddle compatibility): dgc, sync_batch_norm"]


def test_only_rank_0_warns(caplog, monkeypatch):
    monkeypatch.setattr(fleet, "_warned_without_effect", set())
    _two_ranks(rank=1)
    s = DistributedStrategy()
    s.dgc = True
    with caplog.at_level(logging.WARNING, logger="ringflow.distributed"):
        _minimize(s)
    assert not [r for r in caplog.records if "no effect" in r.getMessage()]


def test_pipeline_over_several_ranks_is_a_config_error_at_init():
    s = DistributedStrategy()
    s.pipeline = True
    with pytest.raises(ConfigError, match="pipeline=True with 2 ranks: pipeline parallelism "
                                          "is not supported"):
        fleet.init(role_maker=UserDefinedRoleMaker(
            is_collective=True, current_id=0, worker_endpoints=["a:1", "b:1"]), strategy=s)


def test_pipeline_over_several_ranks_is_a_config_error_at_minimize():
    _two_ranks()
    s = DistributedStrategy()
    s.pipeline = True
    with pytest.raises(ConfigError, match="pipeline parallelism is not supported"):
        _minimize(s)


def test_a_refused_hybrid_configs_assignment_leaves_the_order_too():
    s = DistributedStrategy()
    with pytest.raises(ConfigError):
        s.hybrid_configs = {"order": ["mp", "dp"], "dp_degree": "two"}
    assert s.hybrid_parallel_order == ["dp", "pp", "sharding", "sep", "cp", "mp"]
