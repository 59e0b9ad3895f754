"""Backend `local`: the job runs on this host (the Airflow worker), one launcher agent. Its
processes start from a minimal environment (`ringflow.launch.env.minimal_env`), not the
worker's: the job's variables are what the operator gives it."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ringflow.launch.env import minimal_env
from ringflow_provider.launchers.base import Launcher
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.shells import LocalShell, Shell


def ringflow_home() -> str:
    """This host's ringflow folder (default log, checkpoint and job folders):
    $RINGFLOW_HOME, else ~/.ringflow."""
    return os.path.expanduser(os.environ.get("RINGFLOW_HOME") or "~/.ringflow")


class LocalLauncher(Launcher):
    name = "local"
    show_hosts = False

    def __init__(self, hosts: Sequence[str] = (), **kwargs) -> None:
        super().__init__(list(hosts) or [socket.gethostname()], **kwargs)

    def default_state_dir(self) -> str:
        return f"{ringflow_home()}/jobs"

    def make_shell(self, host: str) -> Shell:
        return LocalShell(host, minimal_env(os.environ))

    def prepare_hosts(self, *, numpy: bool = True, hosts: Sequence[str] | None = None
                      ) -> None:
        """This interpreter has the installed runtime and numpy: nothing to check or ship."""
        for host in self.hosts:
            self.runtimes[host] = Runtime(sys.executable)

    def agent_parts(self, agent_args: Sequence[str], *, nproc_per_host: int, log_dir: str,
                    base_port: int | None, env: Mapping[str, str]
                    ) -> list[tuple[str, list[str]]]:
        return [(self.hosts[0], [sys.executable, "-m", "ringflow.launch", "--stdin",
                                 "--nproc-per-host", str(nproc_per_host), "--log-dir", log_dir,
                                 *agent_args])]

    def put_file(self, host: str, path: str, text: str) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
