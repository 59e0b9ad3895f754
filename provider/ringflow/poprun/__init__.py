"""A CPU `poprun` (`ringflow-poprun`, `python -m ringflow.poprun`): Graphcore poprun's
command line, run on CPU hosts with Open MPI's mpirun as poprun itself does, so a PopRun
DAG's job runs without IPUs. See `args` (the flags), `mpirun` (the plan of mpirun app
contexts they become), `runner` (the job, run by `ringflow.launch.mpirun_job`).
"""

from ringflow.poprun.args import IPU_ONLY, HelpRequested, PopRunArgs, parse_poprun_args, usage
from ringflow.poprun.mpirun import instance_env, mpirun_argv, poprun_plan
from ringflow.poprun.runner import PopRunJob, topology_lines

__all__ = ["IPU_ONLY", "PopRunArgs", "PopRunJob", "instance_env", "main", "mpirun_argv",
           "parse_poprun_args", "poprun_plan", "topology_lines"]


def main(argv: list[str] | None = None) -> int:
    """The console script: a bad command line prints one line and exits 2 (as poprun's
    usage errors do); otherwise the job's exit code."""
    import sys

    from ringflow.errors import ConfigError

    try:
        args = parse_poprun_args(sys.argv[1:] if argv is None else argv)
        return PopRunJob(args).run()
    except HelpRequested:
        print(usage(), end="")
        return 0
    except ConfigError as exc:
        print(f"ringflow-poprun: error: {exc}", file=sys.stderr)
        return 2
