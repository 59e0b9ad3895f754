"""The table of Paddle 3.3's ``DistributedStrategy`` options: every public option, its type
and default (Paddle's ``distributed_strategy.proto`` and the property that reads it), and
whether ringflow gives it an effect. ``strategy.py`` builds the class from this table.

Types: a default of ``bool``, ``int``, ``float`` or ``str`` says the type; ``Repeated(t)`` is
a list of ``t`` (default empty); a dict is a message: a ``*_configs`` option whose keys are
its fields (nested dicts are nested messages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Repeated:
    """A repeated proto field: a list whose items are ``item`` (a type, or a dict: a
    message whose fields are merged into its defaults)."""

    item: Any


STRS, INTS, FLOATS = Repeated(str), Repeated(int), Repeated(float)

# NCCL tuning of a communication group (Paddle's NCCLConfig): accepted, no effect on CPU
_NCCL = {"commName": "", "ll_buffsize": 0, "ll128_buffsize": 0, "simple_buffsize": 0,
         "buffsize_align": 0, "nchannels": 0, "algoStr": "", "protoStr": ""}

HYBRID: dict[str, Any] = {
    "dp_degree": -1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1, "sep_degree": 1,
    "mp_configs": {
        "sync_param": True, "sync_grad": False, "sync_moment": False, "sync_mode": "broadcast",
        "mp_async_allreduce": False, "mp_skip_c_identity": False,
        "mp_fused_linear_param_grad_add": False, "need_broadcast_data": True,
        "recompute_allgather": False, "sp_async_reduce_scatter": False,
        "nccl_config": _NCCL},
    "pp_configs": {
        "dp_comm_overlap": False, "delay_scale_loss": False, "enable_timer": False,
        "sharding_comm_overlap": False, "profiling": False, "release_gradients": False,
        "overlap_p2p_comm": False, "clear_every_step_cache": False, "use_batch_p2p_comm": True,
        "best_unbalanced_scheduler": False, "enable_offload_queue": False,
        "enable_dynamic_shape": False, "use_dualpipev": False,
        "forward_backward_overlap_scheduler": False, "coll_nccl_config": _NCCL,
        "p2p_nccl_config": _NCCL, "shared_nccl_config": _NCCL, "sync_param": False,
        "sync_moment": False, "sync_mode": "broadcast"},
    "sharding_configs": {
        "tensor_fusion": False, "accumulate_steps": 1, "comm_overlap": False,
        "split_param": False, "fuse_optimizer": True, "use_reduce_avg": True,
        "comm_buffer_size_MB": 256, "release_gradients": False, "free_grads_in_comm": False,
        "enable_fuse_optimizer_states": False, "nccl_config": _NCCL,
        "check_nccl_config": _NCCL, "offload_opt_buffer_size": -1},
    "enable_optimizer_timer": False, "split_norm_comm": False, "ep_degree": 1,
    "moe_sharding_degree": 1,
    "dp_configs": {"nccl_config": _NCCL, "check_nccl_config": _NCCL},
    "sep_configs": {"nccl_config": _NCCL},
    "dp_sep_configs": {"nccl_config": _NCCL},
    "pp_tp_configs": {"nccl_config": _NCCL},
    "ep_configs": {"nccl_config": _NCCL, "grad_nccl_config": _NCCL},
    "moe_sharding_configs": {"nccl_config": _NCCL, "check_nccl_config": _NCCL},
    "default_comm_group_configs": {"nccl_config": _NCCL},
    "cp_degree": 1, "cp_sharding_degree": 1,
    "cp_configs": {"nccl_config": _NCCL},
    "cp_sharding_configs": {"nccl_config": _NCCL},
    "dp_cp_configs": {"nccl_config": _NCCL},
    "cp_mp_configs": {"nccl_config": _NCCL},
}
# Paddle's ``hybrid_parallel_order`` default (outermost first); ``order`` in hybrid_configs
HYBRID_ORDER = ["dp", "pp", "sharding", "sep", "cp", "mp"]
SYNC_PARAM_NAME = ["embedding", "layer_norm", ".b_"]

# option -> default, in the order Paddle's proto declares them
OPTIONS: dict[str, Any] = {
    "amp": False, "recompute": False, "localsgd": False, "dgc": False, "gradient_merge": False,
    "lars": False, "lamb": False, "pipeline": False, "elastic": False, "auto": False,
    "a_sync": True, "sync_nccl_allreduce": True, "nccl_comm_num": 1,
    "use_hierarchical_allreduce": False, "hierarchical_allreduce_inter_nranks": 1,
    "sync_batch_norm": False, "fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 32,
    "cudnn_exhaustive_search": False, "conv_workspace_size_limit": 512,
    "cudnn_batchnorm_spatial_persistent": False, "adaptive_localsgd": False,
    "fp16_allreduce": False, "sharding": False, "last_comm_group_size_MB": 1.0,
    "find_unused_parameters": False, "tensor_parallel": False,
    "without_graph_optimization": True, "fuse_grad_size_in_num": 8, "asp": False,
    "fuse_grad_merge": False, "semi_auto": False, "adam_d2sum": False, "auto_search": False,
    "heter_ccl_mode": False, "is_fl_ps_mode": False, "is_with_coordinator": False,
    "qat": False, "split_data": True,
    "recompute_configs": {"checkpoints": STRS, "enable_offload": False,
                          "checkpoint_shape": INTS, "enable_tuning": False,
                          "refined_ops_patterns": Repeated({
                              "main_ops": STRS, "num": 0, "pre_ops": STRS,
                              "suf_ops": STRS})},
    "amp_configs": {
        "init_loss_scaling": 32768.0, "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2,
        "incr_ratio": 2.0, "decr_ratio": 0.8, "use_dynamic_loss_scaling": True,
        "custom_white_list": STRS, "custom_black_list": STRS, "custom_black_varnames": STRS,
        "use_pure_fp16": False, "use_fp16_guard": True, "use_optimizer_fp16": False,
        "use_pure_bf16": False},
    "localsgd_configs": {"k_steps": 1, "begin_step": 1},
    "gradient_merge_configs": {"k_steps": 1, "avg": True},
    "dgc_configs": {"rampup_begin_step": 0, "rampup_step": 1, "sparsity": FLOATS},
    "pipeline_configs": {"micro_batch_size": 1, "accumulate_steps": 1, "schedule_mode": "1F1B",
                         "p2p_cache_shape": True, "enable_partial_send_recv": True},
    "a_sync_configs": {
        "k_steps": -1, "max_merge_var_num": 1, "send_queue_size": 16,
        "independent_recv_thread": False, "min_send_grad_num_before_recv": 1,
        "thread_pool_size": 1, "send_wait_times": 1, "runtime_split_send_recv": False,
        "launch_barrier": True, "heter_worker_device_guard": "cpu", "lr_decay_steps": 10,
        "use_ps_gpu": 0, "use_gpu_graph": 0},
    "lars_configs": {"lars_coeff": 0.001, "lars_weight_decay": 0.0005, "epsilon": 0.0,
                     "exclude_from_weight_decay": STRS},
    "lamb_configs": {"lamb_weight_decay": 0.01, "exclude_from_weight_decay": STRS},
    "adaptive_localsgd_configs": {"init_k_steps": 1, "begin_step": 1},
    "sharding_configs": {
        "sharding_segment_strategy": "segment_broadcast_MB", "segment_broadcast_MB": 32.0,
        "segment_anchors": STRS, "sharding_degree": 8, "mp_degree": 1, "dp_degree": 1,
        "hybrid_dp": False, "gradient_merge_acc_step": 1, "optimize_offload": False,
        "pp_allreduce_in_optimize": False, "pp_degree": 1, "optimize_cast": False,
        "_dp_as_optimizer_sharding": False, "stage": 1, "enable_tuning": False,
        "use_calc_stream": False},
    "hybrid_configs": HYBRID,
    "tensor_parallel_configs": {"tensor_parallel_degree": 1, "tensor_init_seed": -1},
    "trainer_desc_configs": {
        "dump_fields_path": "", "dump_fields": STRS, "dump_param": STRS,
        "stat_var_names": STRS, "trainer": "", "device_worker": "", "local_sparse": STRS,
        "remote_sparse": STRS},
    "fs_client_param": {"uri": "", "user": "", "passwd": "", "hadoop_bin": ""},
    "qat_configs": {"channel_wise_abs_max": True, "weight_bits": 8, "activation_bits": 8,
                    "not_quant_pattern": STRS, "algo": ""},
    "gradient_scale_configs": {"scale_strategy": "avg", "scale_gradient": False},
}
# Parameter-server table descriptions: free-form dicts, kept as given (default: none)
FREE_FORM = ("sparse_table_configs", "fleet_desc_configs")
# ringflow's BuildStrategy (see strategy.py), not a table entry
BUILD_STRATEGY = "build_strategy"

# The options ringflow gives an effect (the other options are accepted with Paddle's types
# and defaults; fleet warns once naming each one set to a value other than its default).
EFFECTIVE = frozenset({
    "amp", "amp_configs", "recompute", "recompute_configs", "lars", "lars_configs", "lamb",
    "lamb_configs", "auto", "tensor_parallel", "tensor_parallel_configs", "sharding",
    "sharding_configs", "hybrid_configs", "fuse_all_reduce_ops", "fuse_grad_size_in_MB",
    "pipeline", "build_strategy", "gradient_merge", "gradient_merge_configs",
    "gradient_scale_configs", "find_unused_parameters", "fp16_allreduce",
    "use_hierarchical_allreduce",
})

# Lower bounds where a smaller value has no meaning (Paddle checks none of them; a degree of 0
# would only surface later as a division by zero). -1: "unset" / "inferred".
MINIMUM = {
    "tensor_parallel_configs": {"tensor_parallel_degree": 1, "tensor_init_seed": -1},
    "amp_configs": {"incr_every_n_steps": 1, "decr_every_n_nan_or_inf": 1},
    "sharding_configs": {"sharding_degree": 1, "mp_degree": 1, "dp_degree": 1, "pp_degree": 1,
                         "gradient_merge_acc_step": 1, "stage": 1},
    "hybrid_configs": {"dp_degree": -1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1,
                       "sep_degree": 1, "cp_degree": 1, "ep_degree": 1,
                       "moe_sharding_degree": 1, "cp_sharding_degree": 1},
    "gradient_merge_configs": {"k_steps": 1},
    "": {"fuse_grad_size_in_MB": 1, "nccl_comm_num": 1, "hierarchical_allreduce_inter_nranks": 1,
         "fuse_grad_size_in_num": 1},
}
# str fields with a closed set of values
CHOICES = {("gradient_scale_configs", "scale_strategy"): ("avg", "sum", "customized")}

# Where Paddle raises for a bad value, the Python exception type it raises (ringflow raises a
# ConfigError that is also one); for every other option Paddle keeps the old value silently
# and ringflow raises a ConfigError (also a TypeError for a value of the wrong type).
PADDLE_RAISES_VALUE_ERROR = frozenset({"a_sync", "adam_d2sum"})
