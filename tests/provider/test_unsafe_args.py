"""Arguments that would run code on the hosts unless the DAG's author allows them: mpirun
options that run commands or write files (PopRun's mpi_global_args, extra_poprun_args),
poprun flags the composition owns or given twice, variables that load code into every rank
(both operators' extra_env and secret_env), each refused naming the argument, the flag and
the switch that allows it; and ports past 65535 refused at the operator."""

from __future__ import annotations

import re

import pytest
from airflow.sdk import BaseOperator
from pydantic import ValidationError

from ringflow.errors import ConfigError
from ringflow_provider.exceptions import RingflowConfigException
from ringflow_provider.jobs.unsafe import (
    check_env,
    check_mpirun_args,
    unsafe_env_name,
    unsafe_mca_param,
    unsafe_mpirun_options,
)
from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.poprun import PopRunConfig, build_poprun_argv, parse_config
from ringflow_provider.poprun.models import ALLOW_FIELDS, FIELD_NAMES, OWNED_FLAGS
from ringflow_provider.tp_train import form
from ringflow_provider.tp_train.args import base_port as tp_base_port

BASE = dict(hosts="n1,n2", nproc_per_host=2, ipus_per_replica=1, num_ipus=4,
            ipu_partition="p", vipu_server="s", training_script="t.py")

UNSAFE_MPI = [
    (["--mca", "plm_rsh_agent", "/tmp/x.sh"], "'--mca plm_rsh_agent'"),
    (["-mca", "orte_launch_agent", "/tmp/x"], "'-mca orte_launch_agent'"),
    (["--gmca", "orte_fork_agent", "strace"], "'--gmca orte_fork_agent'"),
    (["--mca", "plm_rsh_args", "-oProxyCommand=x"], "'--mca plm_rsh_args'"),
    (["--mca", "orte_output_filename", "/etc/cron.d/x"], "'--mca orte_output_filename'"),
    (["--mca", "mca_base_param_files", "/tmp/p.conf"], "'--mca mca_base_param_files'"),
    (["--mca", "orte_tmpdir_base", "/etc"], "'--mca orte_tmpdir_base'"),
    (["--output-filename", "/etc/cron.d"], "'--output-filename'"),
    (["-output-filename", "/etc/cron.d"], "'-output-filename'"),
    (["--report-uri", "/etc/x"], "'--report-uri'"),
    (["--tmpdir", "/etc"], "'--tmpdir'"),
    (["--prefix", "/tmp/ompi"], "'--prefix'"),
    (["--preload-files", "/tmp/x"], "'--preload-files'"),
    (["-s"], "'-s'"),
    (["--launch-agent", "/tmp/orted"], "'--launch-agent'"),
    (["--hostfile", "/tmp/hosts"], "'--hostfile'"),
    (["--rankfile", "/tmp/ranks"], "'--rankfile'"),
    (["--app", "/tmp/appfile"], "'--app'"),
    (["-am", "/tmp/params"], "'-am'"),
    (["--xterm", "0"], "'--xterm'"),
    (["-x", "LD_PRELOAD=/tmp/x.so"], "'-x LD_PRELOAD'"),
    (["-x", "OMPI_MCA_plm_rsh_agent=/tmp/x"], "'-x OMPI_MCA_plm_rsh_agent'"),
]


@pytest.mark.parametrize(("tokens", "named"), UNSAFE_MPI)
def test_mpirun_options_that_run_commands_or_write_files_are_named(tokens, named):
    with pytest.raises(ValueError) as err:
        check_mpirun_args(tokens, "mpi_global_args", allow=False)
    text = str(err.value)
    assert text.startswith("mpi_global_args: ") and named in text
    assert "allow_unsafe_mpi_args=True" in text
    check_mpirun_args(tokens, "mpi_global_args", allow=True)  # the author's decision


def test_ordinary_mpirun_options_pass():
    tokens = ["--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "eth0",
              "--bind-to", "none", "--map-by", "slot", "-x", "OMP_NUM_THREADS=2",
              "--tag-output", "--oversubscribe", "-x", "OMPI_MCA_btl=self,tcp"]
    assert unsafe_mpirun_options(tokens) == []
    assert not unsafe_mca_param("btl_tcp_if_include")


def test_mpirun_options_inside_a_poprun_option_value_are_found():
    found = []
    for item in ("--mpi-global-args=--mca plm_rsh_agent /tmp/x.sh",
                 "--instance-mpi-local-args=0:--output-filename /etc/cron.d",
                 "--tmpdir=/etc"):
        with pytest.raises(ValueError) as err:
            check_mpirun_args([item], "extra_poprun_args", allow=False)
        found.append(str(err.value).split(": ")[1])
    assert found == ["'--mca plm_rsh_agent'", "'--output-filename'", "'--tmpdir'"]


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH",
                                  "PYTHONSTARTUP", "BASH_ENV", "ENV", "PATH",
                                  "BASH_FUNC_ls%%", "OMPI_MCA_plm_rsh_agent",
                                  "OMPI_MCA_orte_output_filename"])
def test_variables_that_load_code_are_unsafe(name):
    assert unsafe_env_name(name)


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "LDAP_URI", "MY_PATH", "ENVIRONMENT",
                                  "OMPI_MCA_btl", "PADDLE_X", "HOME", "LANG"])
def test_ordinary_variables_are_not(name):
    assert not unsafe_env_name(name)


def test_the_env_rule_names_field_variables_and_switch():
    with pytest.raises(ValueError) as err:
        check_env({"PYTHONPATH": "/x", "A": "1", "LD_PRELOAD": "/y"}, "extra_env", allow=False)
    text = str(err.value)
    assert text.startswith("extra_env: LD_PRELOAD, PYTHONPATH would load code into every rank")
    assert "pass allow_unsafe_env=True to the operator" in text
    check_env({"PYTHONPATH": "/x"}, "extra_env", allow=True)


# PopRun ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("override", "message"), [
    (dict(mpi_global_args=["--mca", "plm_rsh_agent", "/tmp/x.sh"]),
     "mpi_global_args: '--mca plm_rsh_agent'"),
    (dict(mpi_global_args=["--output-filename", "/etc/cron.d"]),
     "mpi_global_args: '--output-filename'"),
    (dict(extra_poprun_args=["--mpi-global-args=--mca plm_rsh_agent /tmp/x.sh"]),
     "extra_poprun_args item '--mpi-global-args=--mca plm_rsh_agent /tmp/x.sh': "
     "--mpi-global-args is composed from the operator's own arguments"),
    (dict(extra_poprun_args=["--host=evil"]), "--host is composed from the operator's own"),
    (dict(extra_poprun_args=["-H", "evil"]), "-H is composed from the operator's own"),
    (dict(extra_poprun_args=["--num-instances=8"]), "--num-instances is composed"),
    (dict(extra_poprun_args=["--mpi-local-args=-x LD_PRELOAD=/x"]),
     "--mpi-local-args is composed"),
    (dict(extra_poprun_args=["--executable-cache-path=/a", "--executable-cache-path=/b"]),
     "extra_poprun_args gives --executable-cache-path more than once"),
    (dict(extra_poprun_args=["--tmpdir=/etc"]), "extra_poprun_args: '--tmpdir'"),
    (dict(extra_env={"LD_PRELOAD": "/tmp/x.so"}), "extra_env: LD_PRELOAD would load code"),
    (dict(extra_env={"PYTHONPATH": "/tmp"}), "extra_env: PYTHONPATH would load code"),
    (dict(secret_env={"BASH_ENV": "/tmp/x"}), "secret_env: BASH_ENV would load code"),
    (dict(extra_env={"OMPI_MCA_plm_rsh_agent": "/tmp/x"}),
     "extra_env: OMPI_MCA_plm_rsh_agent would load code"),
    (dict(endpoint_port=65535), "endpoint_port: 65535 with nproc_per_host=2 gives the "
                                "instances ports 65535..65536, beyond 65535"),
])
def test_poprun_refuses_naming_the_argument(override, message):
    with pytest.raises(ConfigError) as err:
        parse_config({**BASE, **override})
    assert message in str(err.value)


def test_poprun_takes_the_unsafe_ones_when_the_author_allows_them():
    cfg = parse_config({**BASE, "mpi_global_args": ["--mca", "plm_rsh_agent", "/tmp/a.sh"],
                        "extra_poprun_args": ["--tmpdir=/scratch"],
                        "extra_env": {"PYTHONPATH": "/opt/lib"},
                        "allow_unsafe_mpi_args": True, "allow_unsafe_env": True})
    argv = build_poprun_argv(cfg)
    assert "--mpi-global-args=--mca plm_rsh_agent /tmp/a.sh" in argv
    assert "--tmpdir=/scratch" in argv
    assert "-x PYTHONPATH=/opt/lib" in next(t for t in argv if t.startswith("--mpi-local"))
    with pytest.raises(ConfigError, match="allow_unsafe_env=True"):  # one does not give both
        parse_config({**BASE, "extra_env": {"PYTHONPATH": "/x"}, "allow_unsafe_mpi_args": True})


def test_the_highest_endpoint_port_that_fits_is_taken():
    assert parse_config({**BASE, "endpoint_port": 65534}).endpoint_port == 65534


def test_an_endpoint_port_past_65535_is_a_field_error_of_endpoint_port():
    with pytest.raises(ValidationError) as err:
        PopRunConfig.model_validate({**BASE, "endpoint_port": 65535})
    assert [e["loc"] for e in err.value.errors()] == [("endpoint_port",)]
    with pytest.raises(RingflowConfigException, match=re.escape(
            "endpoint_port: 65535 with nproc_per_host=2 gives the instances ports 65535..65536")):
        PopRunOperator(task_id="p", **{**BASE, "endpoint_port": 65535})


def test_a_tp_train_base_port_past_65535_is_refused_naming_base_port():
    assert tp_base_port("65534", 2) == 65534
    with pytest.raises(ValueError, match=re.escape("base_port 65535: the ranks' "
                                                       "ports 65535..65536")):
        tp_base_port(65535, 2)


def test_owned_flags_are_every_flag_the_composition_emits():
    cfg = parse_config({**BASE, "mpi_global_args": ["-v"], "popart_log_level": "INFO"})
    argv = build_poprun_argv(cfg)
    emitted = {t.partition("=")[0] for t in argv[1:argv.index(cfg.python)]}
    assert emitted <= OWNED_FLAGS
    assert OWNED_FLAGS - emitted == {"-H"}  # --host's short form


def test_poprun_operator_refuses_at_parse_time_and_the_switches_are_not_templated():
    with pytest.raises(RingflowConfigException, match="task 'p': invalid PopRun "
                       "configuration: extra_env: LD_PRELOAD would load code"):
        PopRunOperator(task_id="p", extra_env={"LD_PRELOAD": "/x.so"}, **BASE)
    op = PopRunOperator(task_id="p", extra_env={"LD_PRELOAD": "/x.so"},
                        mpi_global_args=["--mca", "plm_rsh_agent", "/a"],
                        allow_unsafe_env=True, allow_unsafe_mpi_args=True, **BASE)
    assert (op.allow_unsafe_env, op.allow_unsafe_mpi_args) == (True, True)
    assert not set(ALLOW_FIELDS) & set(PopRunOperator.template_fields)
    assert not set(ALLOW_FIELDS) & set(FIELD_NAMES)
    with pytest.raises(RingflowConfigException, match="allow_unsafe_env: expected True or "
                       "False"):
        PopRunOperator(task_id="p", allow_unsafe_env="{{ params.x }}", **BASE)


def test_a_rendered_unsafe_argument_fails_the_task_without_retry():
    """A trigger's params reach a templated field: refused when the task runs (dry run: no
    SSH)."""
    op = PopRunOperator(task_id="p", dry_run=True, mpi_global_args="{{ params.mpi }}", **BASE)
    op.render_template_fields({"params": {"mpi": '["--mca", "plm_rsh_agent", "/tmp/x"]'}})
    with pytest.raises(RingflowConfigException) as err:
        op.execute({})
    assert str(err.value).startswith("invalid PopRun configuration: mpi_global_args: '--mca "
                                     "plm_rsh_agent': mpirun options that run commands")
    op = PopRunOperator(task_id="p", dry_run=True, mpi_global_args="{{ params.mpi }}",
                        allow_unsafe_mpi_args=True, **BASE)
    op.render_template_fields({"params": {"mpi": '["--mca", "plm_rsh_agent", "/tmp/x"]'}})
    assert "--mpi-global-args=--mca plm_rsh_agent /tmp/x" in op.execute({})["argv"]


# TPTrainOperator ---------------------------------------------------------------------------
def test_tp_train_form_cannot_offer_the_switches():
    for name in ("allow_unsafe_env",):
        with pytest.raises(ValueError, match="not an argument of TPTrainOperator a form can"):
            form.field_schema(name)


def test_tp_train_switch_is_not_templated():
    from ringflow_provider.operators.tp_train import TPTrainOperator

    assert "allow_unsafe_env" not in TPTrainOperator.template_fields
    assert issubclass(TPTrainOperator, BaseOperator)
    assert TPTrainOperator(task_id="t", allow_unsafe_env=True).allow_unsafe_env is True
    with pytest.raises(RingflowConfigException, match="allow_unsafe_env: expected True or "
                       "False"):
        TPTrainOperator(task_id="t", allow_unsafe_env="{{ params.unsafe }}")
