"""One launcher agent per host started by Open MPI's mpirun (TPTrainOperator's
``launcher="mpirun"``): ``python -m ringflow.launch.mpirun --hosts H1,H2 [--stdin] --
python -m ringflow.launch --host-index-env OMPI_COMM_WORLD_RANK ...``.

Runs on the first host. mpirun starts the agent command once per host (one process per
node, MPI rank = host index), each agent starts its host's ranks with the PADDLE_* contract
as always. With ``--stdin`` the first stdin line holds the secret variables (the job token,
secret_env: ``ringflow.launch.stdin``), which reach every agent over SSH, never through
mpirun (``ringflow.launch.secret_drop``), and the end of stdin stops the job (its starter is
gone). The job itself is
`ringflow.launch.mpirun_job`'s: output in whole lines tagged ``[1,<host index>]<stdout>:``,
the first failing agent named, SIGTERM forwarded, leftovers stopped on this host.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ringflow.errors import ConfigError
from ringflow.launch.config import _parse_hosts
from ringflow.launch.mpirun_job import MpirunJob
from ringflow.launch.openmpi import REPORT_EXIT_VAR, AppContext, MpirunPlan
from ringflow.launch.stdin import STDIN_FD, StdinWatch, read_secrets

__all__ = ["AgentsJob", "main"]

PROG = "python -m ringflow.launch.mpirun"


class AgentsJob(MpirunJob):
    prefix = "[launch] mpirun:"

    def intro_lines(self, job_id: str) -> list[str]:
        hosts = self.plan.hosts
        return [f"job {job_id}: one launcher agent on each of {len(hosts)} host(s) "
                f"({','.join(hosts)}), started by Open MPI's mpirun"]


def keepalive_args(heartbeat_s: float | None) -> tuple[str, ...]:
    """Open MPI's own links (mpirun <-> each host's daemon) probed like the ranks' links:
    idle for the heartbeat timeout, then 3 probes a quarter of it apart. A daemon cut off
    from mpirun ends itself then (and with it what it started), instead of after TCP's
    default of hours; mpirun notices a lost daemon as soon."""
    if heartbeat_s is None or not heartbeat_s > 0:
        return ()
    idle, interval = max(1, round(heartbeat_s)), max(1, round(heartbeat_s / 4))
    return ("--mca", "oob_tcp_keepalive_time", str(idle), "--mca", "oob_tcp_keepalive_intvl",
            str(interval), "--mca", "oob_tcp_keepalive_probes", "3")


def heartbeat_of(environ: dict[str, str]) -> float | None:
    try:
        return float(environ.get("RINGFLOW_HEARTBEAT_TIMEOUT") or "20")
    except ValueError:
        return None


def agents_plan(hosts: list[str], agent: list[str], exports: list[str],
                mpi_args: str, secrets: list[str] = (),
                heartbeat_s: float | None = None) -> MpirunPlan:
    """One agent per host (MPI rank = host index), each exported the variables `exports`
    names (bare `-x NAME`: values never on a command line) and given the `secrets` (over
    SSH, never through mpirun: `ringflow.launch.secret_drop`)."""
    options = [part for name in dict.fromkeys(exports) for part in ("-x", name)]
    # The agents' workers must not print exit-time lines (the agents tag their lines).
    options += ["-x", f"{REPORT_EXIT_VAR}=0"]
    contexts = tuple(AppContext(host=host, argv=tuple(agent), options=tuple(options))
                     for host in hosts)
    try:
        global_args = tuple(shlex.split(mpi_args))
    except ValueError as exc:
        raise ConfigError(f"--mpi-args: cannot split {mpi_args!r} into options ({exc})") from None
    return MpirunPlan(contexts, keepalive_args(heartbeat_s) + global_args,
                      secrets=tuple(secrets))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", required=True, metavar="H1,H2",
                        help="the job's hosts in rank order; mpirun runs here, on the first")
    parser.add_argument("--mpirun", default="mpirun", help="Open MPI's mpirun")
    parser.add_argument("--mpi-args", default="", metavar="ARGS",
                        help="more options for mpirun (one string)")
    parser.add_argument("--export", default="", metavar="NAME,NAME",
                        help="variables of this environment to export to every agent")
    parser.add_argument("--stdin", action="store_true",
                        help="secret variables on stdin's first line (JSON); stop the job "
                             "when stdin ends")
    parser.add_argument("agent", nargs=argparse.REMAINDER,
                        help="-- then the agent command every host runs")
    ns = parser.parse_args(argv)
    if ns.agent[:1] == ["--"]:
        ns.agent = ns.agent[1:]
    if not ns.agent:
        raise ConfigError("no agent command after --")
    return ns


def main(argv: list[str] | None = None) -> int:
    try:
        ns = parse(sys.argv[1:] if argv is None else argv)
        hosts = _parse_hosts(ns.hosts)
        environ = dict(os.environ)
        secrets = read_secrets(STDIN_FD) if ns.stdin else {}
        environ.update(secrets)
        names = [n.strip() for n in ns.export.split(",") if n.strip() and
                 n.strip() not in secrets]
        missing = [n for n in names if n not in environ]
        if missing:
            raise ConfigError(f"--export names variables that are not set: {missing}")
        plan = agents_plan(list(hosts), ns.agent, names, ns.mpi_args, list(secrets),
                           heartbeat_of(environ))
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    lifeline = StdinWatch(STDIN_FD) if ns.stdin else None
    try:
        return AgentsJob(plan, environ, mpirun=ns.mpirun, lifeline=lifeline).run()
    except ConfigError as exc:
        print(f"[launch] mpirun: error: {exc}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
