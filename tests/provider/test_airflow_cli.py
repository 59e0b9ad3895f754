"""The provider inside real Airflow: discovery, DAG import, templating and `airflow tasks test`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import airflow as airflow_pkg
import pytest
from airflow.sdk.exceptions import AirflowException

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.poprun import FIELD_NAMES
from tests.provider.conftest import CONN_ID, REPO, VENV_BIN, wait_until
from tests.provider.test_poprun_operator import processes_running

pytestmark = [pytest.mark.airflow]


def airflow(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "airflow"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=180)


def test_airflow_providers_list_shows_the_provider(airflow_home):
    out = airflow("providers", "list", "-o", "json")
    assert out.returncode == 0, out.stderr
    listed = {p["package_name"]: p for p in json.loads(out.stdout)}
    assert listed["airflow-provider-ringflow"]["version"] == "0.1.0"
    assert listed["airflow-provider-ringflow"]["description"].startswith("Launch and supervise")


def test_distribution_declares_the_entry_point_and_dependencies():
    from importlib.metadata import distribution

    dist = distribution("airflow-provider-ringflow")
    points = [(ep.group, ep.name, ep.value) for ep in dist.entry_points
              if ep.group == "apache_airflow_provider"]
    assert points == [("apache_airflow_provider", "provider_info",
                       "ringflow_provider:get_provider_info")]
    plugins = [(ep.name, ep.value) for ep in dist.entry_points if ep.group == "airflow.plugins"]
    assert plugins == [("ringflow", "ringflow_provider.plugins.plugin:RingflowPlugin")]
    # Dependencies as pyproject.toml declares them (an older editable install's metadata may
    # still list Airflow under an extra).
    text = (REPO / "pyproject.toml").read_text()
    assert 'name = "airflow-provider-ringflow"' in text
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    required = {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]: req
                for req in re.findall(r'^\s*"([^"]+)"', block, re.M)}
    assert {"apache-airflow", "apache-airflow-providers-ssh", "paramiko", "pydantic",
            "numpy"} <= set(required)
    assert required["apache-airflow"].startswith("apache-airflow>=3.3")


def test_provider_info_is_valid_for_airflow_3_3():
    """What ProvidersManager validates, with Airflow's own schema; no keys it dropped."""
    from airflow._shared.providers_discovery.providers_discovery import (
        _create_provider_info_schema_validator,
    )

    from ringflow_provider import get_provider_info

    info = get_provider_info()
    _create_provider_info_schema_validator().validate(info)
    schema = json.loads((Path(airflow_pkg.__file__).parent / "provider_info.schema.json")
                        .read_text())
    assert set(info) <= set(schema["properties"])  # e.g. no "versions" (gone since #48849)
    assert info["package-name"] == "airflow-provider-ringflow"
    assert info["operators"][0]["python-modules"] == [
        "ringflow_provider.operators.poprun", "ringflow_provider.operators.tp_train",
        "ringflow_provider.operators.tp_evaluate"]


def test_example_dags_import_with_zero_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["ringflow_poprun"]
    assert [t.task_id for t in dag.tasks] == ["poprun"]
    # The trigger form shows the PopRun fields and the run switches, each typed and described,
    # and typed hyperparameters; not which connection, interpreter, executable, script or
    # options run (free text there could reach any host or run anything), nor secrets (a
    # run's conf is stored and shown as given).
    assert set(dag.params.keys()) == {*FIELD_NAMES, "launch_host", "dry_run", "ringflow_job",
                                      "deferrable", "poll_interval", "steps",
                                      "learning_rate"} - {
        "python", "poprun", "secret_env", "training_script", "training_script_args",
        "mpi_global_args", "extra_poprun_args"}
    task = dag.tasks[0]
    assert (task.ssh_conn_id, task.python, task.poprun, task.mpi_global_args,
            task.extra_poprun_args) == ("ssh_default", "python3", "poprun", [], [])
    assert task.training_script_args == ["--steps", "{{ params.steps }}",
                                         "--learning-rate", "{{ params.learning_rate }}"]
    for name in dag.params:
        param = dag.params.get_param(name)
        assert param.schema.get("type") and param.description, name
    assert dag.params.get_param("extra_env").schema["type"] == "object"
    # the hosts and launch hosts the form offers: Airflow Variable ringflow_poprun_hosts
    # (tests/airflow_env.py sets it for the run)
    assert dag.params.get_param("hosts").schema["enum"] == ["localhost", "n1,n2", "127.0.0.1"]
    assert dag.params.get_param("launch_host").schema["enum"] == [
        None, "127.0.0.1", "localhost", "n1", "n2"]
    assert dag.params["dry_run"] is True
    assert "Connection to create first**: type `ssh`, id `ssh_default`" in dag.doc_md


def test_rendered_fields_stored_by_airflow_mask_secret_env_values():
    """Airflow stores and shows the rendered fields before execute runs."""
    from airflow.sdk.execution_time.task_runner import _serialize_rendered_fields

    op = PopRunOperator(task_id="rtif", hosts="n1", nproc_per_host=1, ipus_per_replica=1,
                        num_ipus=1, ipu_partition="p", vipu_server="s", training_script="t.py",
                        extra_env="{{ params.env | tojson }}",
                        secret_env={"SESSION": "{{ params.session }}"})
    op.render_template_fields({"params": {"env": {"MY_KEY": "k-rtif-31", "PLAIN": "v-5"},
                                          "session": 'se"ss-rtif-77'}})
    stored = json.dumps(_serialize_rendered_fields(op))
    assert "k-rtif-31" not in stored and "ss-rtif-77" not in stored
    assert '\\"MY_KEY\\": \\"***\\"' in stored and "v-5" in stored


def test_literal_arguments_are_validated_when_the_dag_is_parsed():
    with pytest.raises(AirflowException, match=r"task 'bad': invalid PopRun configuration: "
                                               r".*num_ipus=6 is not divisible by "
                                               r"ipus_per_replica=4"):
        PopRunOperator(task_id="bad", hosts="n1", nproc_per_host=1, ipus_per_replica=4,
                       num_ipus=6, ipu_partition="p", vipu_server="s", training_script="t.py")
    with pytest.raises(AirflowException, match=r"host 'n1' appears more than once"):
        PopRunOperator(task_id="bad", hosts="n1,n1", nproc_per_host="{{ params.n }}",
                       ipus_per_replica=1, num_ipus=4, ipu_partition="p", vipu_server="s",
                       training_script="t.py")


def test_templated_arguments_are_validated_when_the_task_runs():
    op = PopRunOperator(task_id="late", hosts="{{ params.hosts }}", nproc_per_host=1,
                        ipus_per_replica=1, num_ipus="{{ params.n }}", ipu_partition="p",
                        vipu_server="s", training_script="t.py", dry_run=True)
    op.render_template_fields({"params": {"hosts": "a, ,b", "n": 4}})
    assert op.hosts == "a, ,b"
    with pytest.raises(AirflowException, match=r"empty host name .* in hosts 'a,,b'"):
        op.execute({})


@pytest.mark.slow
def test_airflow_tasks_test_renders_params_into_a_dry_run(airflow_home):
    params = {"hosts": "n1,n2", "num_ipus": 8, "steps": 30, "learning_rate": 0.05,
              "extra_env": {"API_TOKEN": "tok-dry-7731"}, "popart_log_level": "INFO"}
    out = airflow("tasks", "test", "ringflow_poprun", "poprun", "-t", json.dumps(params),
                  env={"AIRFLOW_VAR_RINGFLOW_POPRUN_SCRIPT": "/opt/models/train.py"})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert ("PopRun job: 4 instance(s) (2 per host on 2 hosts: n1,n2), 8 replica(s) of 1 "
            "IPU(s), partition 'pod16' on V-IPU server '127.0.0.1'") in log
    assert "\n".join([
        "PopRun command on n1:", "poprun \\", "    --num-instances=4 \\",
        "    --num-replicas=8 \\", "    --ipus-per-replica=1 \\", "    --host=n1,n2 \\",
        "    --vipu-partition=pod16 \\", "    --vipu-server-host=127.0.0.1 \\",
        "    --update-partition=no \\", "    --vipu-server-timeout=120 \\",
        "    --print-topology=yes \\", "    --numa-aware=yes \\",
        "    '--mpi-local-args=-x POPART_LOG_LEVEL=INFO -x PADDLE_TRAINERS_NUM=4 "
        "-x PADDLE_TRAINER_ENDPOINTS=n1:8090,n2:8090 -x API_TOKEN' \\",  # its value: over stdin
    ]) in log
    # the DAG author's script (its Variable) with the typed params as its arguments
    assert ("    python3 \\\n    /opt/models/train.py \\\n    --steps \\\n    30 \\\n"
            "    --learning-rate \\\n    0.05") in log
    assert ("dry_run: validated and rendered only; nothing was started (with dry_run False it "
            "runs on n1 over SSH connection 'ssh_default')") in log
    assert "tok-dry-7731" not in log


def as_ssh_default(conn_id: str) -> dict[str, str]:
    """The environment that makes `conn_id` (the test server's connection) the example DAG's
    `ssh_default`, which its trigger form does not let a user change."""
    return {"AIRFLOW_CONN_SSH_DEFAULT": os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"]}


def script_variable(script) -> dict[str, str]:
    """The environment that makes `script` the example DAG's training script (its Airflow
    Variable ringflow_poprun_script: the trigger form does not offer the script)."""
    return {"AIRFLOW_VAR_RINGFLOW_POPRUN_SCRIPT": str(script)}


@pytest.mark.slow
@pytest.mark.ssh
def test_airflow_tasks_test_runs_the_job_over_ssh_with_secrets_masked(airflow_home, sshd,
                                                                      ssh_conn):
    script = sshd.work_dir / "train_cli.py"
    script.write_text("import os\nprint('instance', os.environ['PADDLE_TRAINER_ID'],\n"
                      "      os.environ['API_TOKEN'], os.environ['ECHO_PW'], flush=True)\n")
    params = {"dry_run": False, "hosts": "127.0.0.1", "nproc_per_host": 1, "num_ipus": 2,
              # The connection's password, echoed by the job, must be masked too.
              "extra_env": {"API_TOKEN": "tok-live-5521", "ECHO_PW": "conn-pw-Zq81"}}
    conn_env = {**as_ssh_default(CONN_ID), **script_variable(script)}
    out = airflow("tasks", "test", "ringflow_poprun", "poprun", "-t", json.dumps(params),
                  env=conn_env)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "standin-poprun argv=" in log
    assert "instance 0 *** ***" in log
    assert "tok-live-5521" not in log
    assert "conn-pw-Zq81" not in log
    # the job's folder in the default state dir: how it ended, and no secret in any file
    (folder,) = [f for f in (sshd.home / ".ringflow" / "jobs").glob("*/try-1")
                 if b"train_cli.py" in (f / "output.log").read_bytes()]
    assert '"exit_code": 0' in (folder / "status.json").read_text()
    for path in folder.iterdir():
        text = path.read_bytes()
        assert b"tok-live-5521" not in text and b"conn-pw-Zq81" not in text, path.name


@pytest.mark.slow
@pytest.mark.ssh
def test_sigterm_to_the_task_runs_on_kill_and_leaves_no_remote_process(airflow_home, sshd,
                                                                        ssh_conn):
    """Airflow's SIGTERM handler calls on_kill, then execute resumes: the task must fail."""
    script = sshd.work_dir / "train_sigterm.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(300)\n")
    params = {"dry_run": False, "hosts": "127.0.0.1", "nproc_per_host": 1, "num_ipus": 1}
    conn_env = {**as_ssh_default(CONN_ID), **script_variable(script)}
    proc = subprocess.Popen(
        [str(VENV_BIN / "airflow"), "tasks", "test", "ringflow_poprun", "poprun", "-t",
         json.dumps(params)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **conn_env})
    try:
        # "python3 <script>" matches the remote side only, not this CLI's own arguments.
        remote = f"python3 {script}"
        wait_until(lambda: processes_running(remote), 90, "the remote job to start")
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert "was killed (on_kill)" in log, log[-3000:]
    assert re.search(r"stopping the job on 127\.0\.0\.1: asked the supervisor \(pid \d+\) to "
                     r"stop the job: on_kill: the task was killed in Airflow", log), log[-3000:]
    wait_until(lambda: not processes_running(remote), 20, "the remote group to die")
    (folder,) = [f for f in (sshd.home / ".ringflow" / "jobs").glob("*/try-1")
                 if b"train_sigterm.py" in (f / "output.log").read_bytes()]
    wait_until(lambda: '"stopped_by": "request"' in (folder / "status.json").read_text(), 20,
               "the job's status to say it was stopped")
