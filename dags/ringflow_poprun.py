"""Launch a Graphcore PopRun job over SSH with ringflow's `PopRunOperator`.

**Connection to create first**: type `ssh`, id `ssh_default` (or the id you give the
`ssh_conn_id` param): the login and a private key (extra `key_file` or `private_key`) that
every host of the job accepts; the connection's port is used, its host is replaced by each job
host. Host keys are verified (apache-airflow-providers-ssh 7): put the hosts in the worker's
`known_hosts`, or set the `host_key` extra (or, accepting the risk, `no_host_key_check`):

    airflow connections add ssh_default --conn-type ssh --conn-login ubuntu \\
        --conn-extra '{"key_file": "/home/airflow/.ssh/id_ed25519"}'

poprun then starts the instances on the other hosts through mpirun, which needs passwordless
SSH from the launch host (the first host unless `launch_host` is set) to every host.

Every PopRun field but three is a param of the trigger form; **params reach the hosts**
(hosts, script arguments and `extra_env` end up on poprun's command line there), so whoever
may trigger this DAG may run that script with those arguments. Which connection, interpreter
and poprun executable a run uses is the DAG author's choice, not the trigger form's: edit
`SSH_CONN_ID`, `PYTHON` and `POPRUN` below. Secrets do not belong in params (a run's conf is
stored and shown as given): give them as `secret_env={"NAME": "{{ var.value.name }}"}` in
the operator, which sends them over SSH's stdin, never on a command line. `dry_run` is on by
default: the task only renders, validates and logs the command; switch it off to run the
job. `ringflow_job` makes a job id and a secret job token per try for instances that are
ringflow workers.

**Without IPUs**: with `POPRUN = "ringflow-poprun"` the same command runs on CPU hosts, on
Open MPI's mpirun (installed on every host); the ringflow runtime is shipped to the hosts
first. The training script must then run on CPU: `examples/poprun_dp_train.py` is one.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from ringflow_provider.operators.poprun import PopRunOperator

JOB, OPTIONS, RUN = "PopRun job", "PopRun options", "How to run"
SSH_CONN_ID = "ssh_default"  # an Airflow connection of type ssh that reaches every host
PYTHON = "python3"           # the interpreter on the hosts
POPRUN = "poprun"            # the poprun executable on the launch host ("ringflow-poprun": CPU)


def _list_param(default: list, description: str, section: str = OPTIONS) -> Param:
    return Param(default, type="array", items={"type": "string"}, description=description,
                 section=section)


PARAMS = {
    "hosts": Param("localhost", type="string", minLength=1, section=JOB,
                   description="Hosts that run instances, comma-separated (hostnames or IPv4)"),
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
    "training_script": Param("train.py", type="string", minLength=1, section=JOB,
                             description="Script every instance runs, as a path on the hosts"),
    "training_script_args": _list_param([], "Arguments of the training script, one per item",
                                         JOB),
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
    "mpi_global_args": _list_param([], "mpirun options, one token per item "
                                       "(--mpi-global-args)"),
    "extra_poprun_args": _list_param([], "Further poprun flags, e.g. "
                                         "--executable-cache-path=DIR"),
    "extra_env": Param({}, type="object", additionalProperties={"type": "string"},
                       section=OPTIONS,
                       description="Variables exported to every instance (mpirun -x NAME=VALUE)."
                                   " Not for secrets: trigger params are stored and shown"),
    "launch_host": Param(None, type=["null", "string"], section=RUN,
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
        training_script="{{ params.training_script }}",
        training_script_args="{{ params.training_script_args | tojson }}",
        python=PYTHON,
        popart_log_level="{{ params.popart_log_level or '' }}",
        endpoint_port="{{ params.endpoint_port }}",
        update_partition="{{ params.update_partition }}",
        vipu_server_timeout="{{ params.vipu_server_timeout }}",
        print_topology="{{ params.print_topology }}",
        numa_aware="{{ params.numa_aware }}",
        mpi_global_args="{{ params.mpi_global_args | tojson }}",
        extra_poprun_args="{{ params.extra_poprun_args | tojson }}",
        extra_env="{{ params.extra_env | tojson }}",
        poprun=POPRUN,
        ssh_conn_id=SSH_CONN_ID,
        launch_host="{{ params.launch_host or '' }}",
        dry_run="{{ params.dry_run }}",
        ringflow_job="{{ params.ringflow_job }}",
        deferrable="{{ params.deferrable }}",
        poll_interval="{{ params.poll_interval }}",
    )
