"""PopRunOperator's arguments: their defaults, as documented and as PopRunConfig's (no SSH)."""

from __future__ import annotations

import inspect

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.poprun import FIELD_NAMES, PopRunConfig


def test_operator_defaults_are_the_documented_ones():
    op = PopRunOperator(task_id="d", hosts="n1,n2", nproc_per_host=1, ipus_per_replica=1,
                        num_ipus=2, ipu_partition="p", vipu_server="s", training_script="t.py")
    assert (op.ssh_conn_id, op.launch_host, op.preflight, op.dry_run, op.ringflow_job) == (
        "ssh_default", None, True, False, False)
    assert (op.extra_env, op.secret_env) == (None, None)
    assert (op.conn_timeout, op.cmd_timeout, op.retries) == (10, None, 1)
    assert (op.python, op.endpoint_port, op.update_partition, op.vipu_server_timeout) == (
        "python3", 8090, False, 120)
    assert (op.print_topology, op.numa_aware, op.poprun, op.training_script_args) == (
        True, True, "poprun", [])
    assert (op.hook.conn_timeout, op.hook.cmd_timeout) == (10, None)
    assert (op.deferrable, op.poll_interval, op.lease_timeout, op.on_existing) == (
        False, 10.0, 1800.0, "reattach")
    assert set(PopRunOperator.template_fields) == {
        *FIELD_NAMES, "ssh_conn_id", "launch_host", "dry_run", "ringflow_job", "deferrable",
        "poll_interval", "lease_timeout", "on_existing"}


def test_operator_argument_defaults_equal_the_model_defaults():
    params = inspect.signature(PopRunOperator.__init__).parameters
    for name, field in PopRunConfig.model_fields.items():
        default = params[name].default
        if field.is_required():
            assert default is inspect.Parameter.empty, name
        elif name == "training_script_args":
            assert (default, field.default) == (None, [])  # None becomes [] in __init__
        else:
            assert default == field.default, name
