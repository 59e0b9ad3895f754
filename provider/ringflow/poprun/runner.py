"""Running one PopRun job on CPU hosts: its plan run by `ringflow.launch.mpirun_job`, with
poprun's own lines (what runs where, the IPU-only flags it ignored) and `ringflow-poprun:`
before each line of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO

from ringflow.launch.mpirun_job import Lifeline, MpirunJob
from ringflow.poprun.args import PopRunArgs
from ringflow.poprun.mpirun import poprun_plan

__all__ = ["PopRunJob", "topology_lines"]

PREFIX = "ringflow-poprun:"


def topology_lines(args: PopRunArgs) -> list[str]:
    """--print-topology: which instance runs where with which replicas."""
    local = args.replicas // args.num_instances
    lines = [f"{'host':<24} {'instance':>8} {'replicas':>12}"]
    for instance in range(args.num_instances):
        first = instance * local
        replicas = f"{first}" if local == 1 else f"{first}-{first + local - 1}"
        lines.append(f"{args.host_of(instance):<24} {instance:>8} {replicas:>12}")
    return lines


class PopRunJob(MpirunJob):
    """One run of `args` under mpirun; `run()` returns the exit code."""

    prefix = PREFIX

    def __init__(self, args: PopRunArgs, environ: Mapping[str, str] | None = None,
                 stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 mpirun: str = "mpirun", lifeline: Lifeline | None = None) -> None:
        super().__init__(poprun_plan(args), environ, stdout, stderr, mpirun, lifeline,
                         only_output_from=args.only_output_from_instance,
                         verbose=bool(args.verbose))
        self.args = args

    def intro_lines(self, job_id: str) -> list[str]:
        args = self.args
        lines = [f"{args.num_instances} instance(s) on {len(args.hosts)} host(s) "
                 f"({','.join(args.hosts)}, {args.per_host} each), {args.replicas} replica(s); "
                 f"job {job_id}; Open MPI's mpirun runs them (CPU, no IPUs)"]
        if args.ignored:
            lines.append("IPU-only options accepted and ignored: " + " ".join(args.ignored))
        if args.print_topology:
            lines += topology_lines(args)
        return lines
