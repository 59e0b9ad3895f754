"""The mpirun plan a PopRunArgs becomes (`ringflow.launch.openmpi` makes the command of it).

As poprun does, one process (app context) per instance on its host of a contiguous block
(instance i on host i // per_host, as Paddle's launcher assumes), with its own `-x` exports:
`--mpi-local-args`, then its `--instance-mpi-local-args`, then the POPDIST_* variables.
MPI rank = instance index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ringflow.launch.env import JOB_ID_VAR
from ringflow.launch.openmpi import AppContext, MpirunPlan, exported_values
from ringflow.launch.openmpi import mpirun_argv as plan_argv
from ringflow.poprun.args import PopRunArgs

__all__ = ["instance_env", "mpirun_argv", "poprun_plan", "vipu_env"]


def instance_env(args: PopRunArgs, instance: int, vipu: Mapping[str, str]) -> dict[str, str]:
    """The POPDIST_* (and IPUOF_VIPU_API_*) variables poprun exports to one instance.
    POPDIST_LOCAL_INSTANCE_INDEX is the instance's index on its host."""
    local = args.replicas // args.num_instances
    return {
        "POPDIST_NUM_TOTAL_REPLICAS": str(args.replicas),
        "POPDIST_NUM_IPUS_PER_REPLICA": str(args.ipus_per_replica),
        "POPDIST_NUM_LOCAL_REPLICAS": str(local),
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "POPDIST_REPLICA_INDEX_OFFSET": str(instance * local),
        "POPDIST_LOCAL_INSTANCE_INDEX": str(instance % args.per_host),
        **vipu,
    }


def vipu_env(ignored: Sequence[str]) -> dict[str, str]:
    """IPUOF_VIPU_API_* as poprun derives them from its V-IPU flags (with its defaults)."""
    given = dict(option.split("=", 1) for option in ignored)
    env = {"IPUOF_VIPU_API_PORT": given.get("--vipu-server-port", "8090"),
           "IPUOF_VIPU_API_TIMEOUT": given.get("--vipu-server-timeout", "120")}
    if "--vipu-server-host" in given:
        env["IPUOF_VIPU_API_HOST"] = given["--vipu-server-host"]
    if "--vipu-partition" in given:
        env["IPUOF_VIPU_API_PARTITION_ID"] = given["--vipu-partition"]
    return env


def poprun_plan(args: PopRunArgs) -> MpirunPlan:
    """One app context per instance; the job's id is the one `--mpi-local-args` sets."""
    vipu = vipu_env(args.ignored)
    contexts = tuple(
        AppContext(host=args.host_of(instance), argv=tuple(args.program), slots=args.per_host,
                   options=(*args.mpi_local_args,
                            *args.instance_mpi_local_args.get(instance, ())),
                   env=instance_env(args, instance, vipu))
        for instance in range(args.num_instances))
    # a bare `-x NAME` exports this environment's value: how the operator passes secrets
    # (never on a command line); they reach the hosts over SSH, not through mpirun
    bare = [item for flag, item in zip(args.mpi_local_args, args.mpi_local_args[1:])
            if flag == "-x" and "=" not in item]
    return MpirunPlan(contexts, args.mpi_global_args,
                      exported_values(args.mpi_local_args).get(JOB_ID_VAR),
                      secrets=tuple(dict.fromkeys(bare)))


def mpirun_argv(args: PopRunArgs, environ: Mapping[str, str], mpirun: str = "mpirun",
                as_root: bool | None = None) -> list[str]:
    """mpirun's argv for `args` (see `ringflow.launch.openmpi.mpirun_argv`)."""
    return plan_argv(poprun_plan(args), environ, mpirun, as_root)
