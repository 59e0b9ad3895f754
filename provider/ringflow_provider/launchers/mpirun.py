"""Backend `mpirun`: Open MPI's mpirun on the first host, under its supervisor, starts one
ringflow launcher agent on every host (`python -m ringflow.launch.mpirun`); each agent
takes its host index from its MPI rank, and the agents' lines come back through mpirun
tagged with it. Needs Open MPI on every host and SSH from the first host to the others."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ringflow.errors import LaunchError
from ringflow.launch.leftovers import stop_task_command
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.base import TASK_VAR
from ringflow_provider.launchers.job import TaskKey
from ringflow_provider.launchers.ssh import SSHLauncher


class MpirunLauncher(SSHLauncher):
    name = "mpirun"

    def prepare_hosts(self, *, numpy: bool = True, hosts: Sequence[str] | None = None
                      ) -> None:
        super().prepare_hosts(numpy=numpy, hosts=hosts)
        check_mpirun(self, self.hosts[0])
        same_runtime_path(self, "launcher 'mpirun'")

    def agent_parts(self, agent_args: Sequence[str], *, nproc_per_host: int, log_dir: str,
                    base_port: int | None, env: Mapping[str, str]
                    ) -> list[tuple[str, list[str]]]:
        if base_port is None:
            raise LaunchError("the agents of several hosts need a base port")
        agent = [self.python, "-m", "ringflow.launch", "--nproc-per-host", str(nproc_per_host),
                 "--hosts", ",".join(self.hosts), "--host-index-env", "OMPI_COMM_WORLD_RANK",
                 "--base-port", str(base_port), "--log-dir", log_dir, *agent_args]
        exports = ["PYTHONPATH", TASK_VAR, *env]
        return [(self.hosts[0], [self.python, "-m", "ringflow.launch.mpirun", "--hosts",
                                 ",".join(self.hosts), "--stdin", "--export",
                                 ",".join(dict.fromkeys(exports)), "--", *agent])]

    def stop_leftovers(self, task: TaskKey) -> None:
        """The agents mpirun started on the other hosts run without a supervisor there:
        what an earlier try left (every process carries the task's marker, which mpirun
        exports) is stopped on every host."""
        def stop(host: str) -> str:
            runtime = self.runtime(host)
            argv = stop_task_command(runtime.python, TASK_VAR, task.key)
            prefix = f"PYTHONPATH={shlex.quote(runtime.pythonpath)} " if runtime.pythonpath \
                else ""
            code, out, err = self.run(host, prefix + shlex.join(argv))
            if code != 0:
                raise LaunchError(f"host {host!r}: stopping an earlier try failed: "
                                  f"{(err or out).strip()}")
            return out.strip()

        for host, said in self.on_every_host(stop, "stopping earlier tries").items():
            if not said.startswith("nothing"):
                self.log.info("host %s: %s", host, said)


def check_mpirun(launcher: SSHLauncher, host: str) -> str:
    """Open MPI's mpirun on `host` (its path), else a LaunchError saying how to get it."""
    code, out, _ = launcher.run(host, commands.find_executable_command("mpirun"))
    if code != 0:
        raise LaunchError(f"Open MPI's mpirun not found on {host!r}, which starts the job's "
                          f"processes with it (Debian: apt install openmpi-bin)")
    launcher.log.info("mpirun on %s: %s", host, out.strip())
    return out.strip()


def same_runtime_path(launcher: SSHLauncher, who: str) -> None:
    """mpirun exports the first host's PYTHONPATH to every process: the runtime must be at
    the same path everywhere (the SSH login's home the same path on every host)."""
    first = launcher.hosts[0]
    path = launcher.runtime(first).pythonpath
    other = [f"{launcher.runtime(h).pythonpath} on {h!r}" for h in launcher.hosts
             if launcher.runtime(h).pythonpath != path]
    if other:
        raise LaunchError(f"{who}: the runtime is at {path} on {first!r} but at "
                          f"{', '.join(other)}: mpirun exports one PYTHONPATH to every "
                          f"process, so the SSH login's home must be the same path on every "
                          f"host (or use launcher 'ssh')")
