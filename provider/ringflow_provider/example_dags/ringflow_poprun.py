"""Launch a Graphcore PopRun job over SSH with ringflow's `PopRunOperator`.

**Connection to create first**: type `ssh`, id `ssh_default` (or the id in `SSH_CONN_ID`
below): the login and a private key (extra `key_file` or `private_key`) that
every host of the job accepts; the connection's port is used, its host is replaced by each job
host. Host keys are verified (apache-airflow-providers-ssh 7): put the hosts in the worker's
`known_hosts`, or set the `host_key` extra (or, accepting the risk, `no_host_key_check`):

    airflow connections add ssh_default --conn-type ssh --conn-login ubuntu \\
        --conn-extra '{"key_file": "/home/airflow/.ssh/id_ed25519"}'

poprun then starts the instances on the other hosts through mpirun, which needs passwordless
SSH from the launch host (the first host unless `launch_host` is set) to every host.

**Params reach the hosts**, so the trigger form offers only typed values and the choices you
allow: whoever may trigger this DAG picks the hosts among the host lists of the Airflow
Variable `ringflow_poprun_hosts` (a JSON list; a host list is a comma-separated string or a
list of names; read when this file is parsed; unset: `localhost`), the launch host among
their hosts, and the training's hyperparameters (`steps`, `learning_rate`), which
`TRAINING_SCRIPT_ARGS` below maps into the script's arguments. The script is yours: the
Airflow Variable `ringflow_poprun_script` (read when the task runs), else `train.py`. Which
connection, interpreter, poprun executable and mpirun or poprun options a run uses is yours
too: edit `SSH_CONN_ID`, `PYTHON`, `POPRUN`, `MPI_GLOBAL_ARGS` and `EXTRA_POPRUN_ARGS`.
Airflow refuses a run whose conf says anything else:

    airflow variables set ringflow_poprun_hosts '["ipu-a,ipu-b", ["ipu-c", "ipu-d"]]'
    airflow variables set ringflow_poprun_script /opt/models/train.py

Give the connection an `allowed_hosts` extra too (`{"allowed_hosts": ["ipu-*"]}`): the task
refuses, before connecting, a host (or launch host) it does not list. `extra_env` values reach
every instance (`mpirun -x`). Secrets do not belong in params (a run's conf is stored and
shown as given): give them as `secret_env={"NAME": "{{ var.value.name }}"}` in the operator,
which sends them over SSH's stdin, never on a command line. `dry_run` is on by default: the
task only renders, validates and logs the command; switch it off to run the job.
`ringflow_job` makes a job id and a secret job token per try for instances that are ringflow
workers.

**Without IPUs**: with `POPRUN = "ringflow-poprun"` the same command runs on CPU hosts, on
Open MPI's mpirun (installed on every host); the ringflow runtime is shipped to the hosts
first. The training script must then run on CPU: `examples/poprun_dp_train.py` is one (it
takes `--steps` and `--learning-rate`).
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.tp_train import variable_choices

JOB, TRAINING, OPTIONS, RUN = "PopRun job", "Training", "PopRun options", "How to run"
SSH_CONN_ID = "ssh_default"  # an Airflow connection of type ssh that reaches every host
PYTHON = "python3"           # the interpreter on the hosts
POPRUN = "poprun"            # the poprun executable on the launch host ("ringflow-poprun": CPU)
#: the host lists the form offers (the first: the default)
HOST_LISTS = variable_choices("ringflow_poprun_hosts", ["localhost"])
#: the launch hosts it offers (empty: the first host of the list chosen)
LAUNCH_HOSTS = [None, *sorted({h.strip() for hosts in HOST_LISTS
                               for h in str(hosts).split(",")})]
#: the script every instance runs, a path on the hosts
TRAINING_SCRIPT = "{{ var.value.get('ringflow_poprun_script', 'train.py') }}"
#: its arguments: made from the typed params only
TRAINING_SCRIPT_ARGS = ["--steps", "{{ params.steps }}",
                        "--learning-rate", "{{ params.learning_rate }}"]
MPI_GLOBAL_ARGS: list[str] = []    # mpirun options, one token per item (--mpi-global-args)
EXTRA_POPRUN_ARGS: list[str] = []  # further poprun flags, e.g. --executable-cache-path=DIR

PARAMS = {
    "hosts": Param(HOST_LISTS[0], type="string", enum=HOST_LISTS, section=JOB,
                   description="Hosts that run instances, comma-separated; the choices: "
                               "Airflow Variable ringflow_poprun_hosts"),
    "nproc_per_host": Param(2, type="integer", minimum=1, section=JOB,
                            description="PopRun instances per host"),
    "ipus_per_replica": Param(1, type="integer", minimum=1, section=JOB,
                              description="IPUs per replica (--ipus-per-replica)"),
    "num_ipus": Param(4, type="integer", minimum=1, section=JOB,
                      description="IPUs in total; num_ipus / ipus_per_replica replicas, a "
                                  "multiple of hosts x nproc_per_host"),
    "ipu_partition": Param("pod16", type="string", minLength=1, section=JOB,
                           description="V-IPU partition (--vipu-partition)"),
    "vipu_server": Param("127.0.0.1", type="string", minLength=1, section=JOB,
                         description="V-IPU server host (--vipu-server-host)"),
    "steps": Param(10, type="integer", minimum=1, maximum=1_000_000, section=TRAINING,
                   description="Training steps (the script's --steps)"),
    "learning_rate": Param(0.1, type="number", exclusiveMinimum=0, maximum=10,
                           section=TRAINING,
                           description="The optimizer's learning rate (--learning-rate)"),
    "popart_log_level": Param(None, type=["null", "string"], section=OPTIONS,
                              enum=[None, "TRACE", "DEBUG", "INFO", "WARN", "ERR", "CRITICAL",
                                    "OFF"],
                              description="POPART_LOG_LEVEL for every instance; empty: unset"),
    "endpoint_port": Param(8090, type="integer", minimum=1, maximum=65535, section=OPTIONS,
                           description="Port of the per-host PADDLE_TRAINER_ENDPOINTS"),
    "update_partition": Param(False, type="boolean", section=OPTIONS,
                              description="--update-partition (update it if needed)"),
    "vipu_server_timeout": Param(120, type="integer", minimum=1, section=OPTIONS,
                                 description="--vipu-server-timeout, seconds"),
    "print_topology": Param(True, type="boolean", section=OPTIONS,
                            description="--print-topology"),
    "numa_aware": Param(True, type="boolean", section=OPTIONS, description="--numa-aware"),
    "extra_env": Param({}, type="object", additionalProperties={"type": "string"},
                       section=OPTIONS,
                       description="Variables exported to every instance (mpirun -x NAME=VALUE)."
                                   " Not for secrets: trigger params are stored and shown"),
    "launch_host": Param(None, type=["null", "string"], enum=LAUNCH_HOSTS, section=RUN,
                         description="Host that runs poprun; empty: the first of hosts"),
    "dry_run": Param(True, type="boolean", section=RUN,
                     description="Only render, validate and log the command; no SSH"),
    "deferrable": Param(False, type="boolean", section=RUN,
                        description="Hand the watch of the job to Airflow's triggerer: no "
                                    "worker slot is held while it runs"),
    "poll_interval": Param(10, type="number", minimum=0.5, maximum=3600, section=RUN,
                           description="With deferrable: seconds between the triggerer's "
                                       "looks at the job"),
    "ringflow_job": Param(False, type="boolean", section=RUN,
                          description="The instances are ringflow workers: give them a job id "
                                      "and a secret job token per try"),
}

with DAG(
    dag_id="ringflow_poprun",
    description="Graphcore PopRun job over SSH (ringflow PopRunOperator)",
    schedule=None,
    catchup=False,
    params=PARAMS,
    doc_md=__doc__,
    tags=["ringflow", "poprun"],
) as dag:
    PopRunOperator(
        task_id="poprun",
        hosts="{{ params.hosts }}",
        nproc_per_host="{{ params.nproc_per_host }}",
        ipus_per_replica="{{ params.ipus_per_replica }}",
        num_ipus="{{ params.num_ipus }}",
        ipu_partition="{{ params.ipu_partition }}",
        vipu_server="{{ params.vipu_server }}",
        training_script=TRAINING_SCRIPT,
        training_script_args=TRAINING_SCRIPT_ARGS,
        python=PYTHON,
        popart_log_level="{{ params.popart_log_level or '' }}",
        endpoint_port="{{ params.endpoint_port }}",
        update_partition="{{ params.update_partition }}",
        vipu_server_timeout="{{ params.vipu_server_timeout }}",
        print_topology="{{ params.print_topology }}",
        numa_aware="{{ params.numa_aware }}",
        mpi_global_args=MPI_GLOBAL_ARGS,
        extra_poprun_args=EXTRA_POPRUN_ARGS,
        extra_env="{{ params.extra_env | tojson }}",
        poprun=POPRUN,
        ssh_conn_id=SSH_CONN_ID,
        launch_host="{{ params.launch_host or '' }}",
        dry_run="{{ params.dry_run }}",
        ringflow_job="{{ params.ringflow_job }}",
        deferrable="{{ params.deferrable }}",
        poll_interval="{{ params.poll_interval }}",
    )
