"""Example: launch a Graphcore PopRun job over SSH with PopRunOperator.

Connection to create (type ``ssh``), id ``ssh_default`` or whatever ``ssh_conn_id`` says: login
and a private key (extra ``key_file`` or ``private_key``) accepted on every host of the job;
the port is the connection's; the host field is replaced by each job host. Host keys are
verified (apache-airflow-providers-ssh 7): put the hosts in the worker's known_hosts, or set the
``host_key`` extra, or (not recommended) ``no_host_key_check``. For example::

    airflow connections add ssh_default --conn-type ssh --conn-login ubuntu \\
        --conn-extra '{"key_file": "/home/airflow/.ssh/id_ed25519"}'

Every PopRun field is a DAG param, so the trigger form shows them all; ``dry_run`` (default
True here) only renders, validates and logs the command.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from ringflow_provider.operators.poprun import PopRunOperator


def _list_param(default: list, description: str) -> Param:
    return Param(default, type="array", items={"type": "string"}, description=description)


PARAMS = {
    "hosts": Param("localhost", type="string", description="Comma-separated hosts"),
    "nproc_per_host": Param(2, type="integer", minimum=1, description="Instances per host"),
    "ipus_per_replica": Param(1, type="integer", minimum=1),
    "num_ipus": Param(4, type="integer", minimum=1, description="IPUs in total"),
    "ipu_partition": Param("pod16", type="string", minLength=1),
    "vipu_server": Param("127.0.0.1", type="string", minLength=1),
    "training_script": Param("train.py", type="string", minLength=1),
    "training_script_args": _list_param([], "Arguments of the training script"),
    "python": Param("python3", type="string", minLength=1, description="Interpreter on hosts"),
    "popart_log_level": Param(None, type=["null", "string"],
                              enum=[None, "TRACE", "DEBUG", "INFO", "WARN", "ERR", "CRITICAL",
                                    "OFF"]),
    "endpoint_port": Param(8090, type="integer", minimum=1, maximum=65535),
    "update_partition": Param(False, type="boolean"),
    "vipu_server_timeout": Param(120, type="integer", minimum=1),
    "print_topology": Param(True, type="boolean"),
    "numa_aware": Param(True, type="boolean"),
    "mpi_global_args": _list_param([], "Tokens of --mpi-global-args"),
    "extra_poprun_args": _list_param([], "Further poprun flags, e.g. --executable-cache-path=DIR"),
    "extra_env": Param({}, type="object", additionalProperties={"type": "string"},
                       description="Variables exported to every instance (mpirun -x)"),
    "poprun": Param("poprun", type="string", minLength=1),
    "ssh_conn_id": Param("ssh_default", type="string", minLength=1),
    "dry_run": Param(True, type="boolean", description="Only render, validate and log"),
}

with DAG(
    dag_id="ringflow_poprun",
    description="Graphcore PopRun job over SSH (ringflow PopRunOperator)",
    schedule=None,
    catchup=False,
    params=PARAMS,
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
        python="{{ params.python }}",
        popart_log_level="{{ params.popart_log_level or '' }}",
        endpoint_port="{{ params.endpoint_port }}",
        update_partition="{{ params.update_partition }}",
        vipu_server_timeout="{{ params.vipu_server_timeout }}",
        print_topology="{{ params.print_topology }}",
        numa_aware="{{ params.numa_aware }}",
        mpi_global_args="{{ params.mpi_global_args | tojson }}",
        extra_poprun_args="{{ params.extra_poprun_args | tojson }}",
        extra_env="{{ params.extra_env | tojson }}",
        poprun="{{ params.poprun }}",
        ssh_conn_id="{{ params.ssh_conn_id }}",
        dry_run="{{ params.dry_run }}",
    )
