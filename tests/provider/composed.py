"""Launchers whose hosts only record: what an operator's `execute` would send to each host
(the start command, its stdin line, the files it writes), without SSH or processes.

The property tests run thousands of argument sets per operator; a real host per example
cannot fit in the suite's time, so the hosts' side alone is a stand-in here: every command the
launcher composes is the real one (`Launcher.start`, `launchers.commands`), and the job stops
right after it is composed (`Composed` carries what was sent). The same commands run on real
hosts in test_tp_train_hosts.py, test_cpu_poprun_hosts.py and test_launcher_commands.py.
"""

from __future__ import annotations

import json
import types
import uuid
from dataclasses import dataclass
from typing import Any

from ringflow.launch.supervisor import STARTED_PREFIX
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.local import LocalLauncher
from ringflow_provider.launchers.mpirun import MpirunLauncher
from ringflow_provider.launchers.ssh import SSHLauncher

SHIPPED = "/home/u/.ringflow/runtime/ringflow-0"  # where a host's runtime would be
HOME = "/home/u"
JOB_ID = "0123456789ab"  # the job id an operator makes under `known_identity`


@dataclass
class Sent:
    """What one host was sent to start its part: the shell text and the stdin line."""

    host: str
    command: str
    stdin: str


class Composed(Exception):
    """Raised once the job's parts were composed; `sent` holds them, `files` what was
    written on the hosts ((host, path) -> text)."""

    def __init__(self, sent: list[Sent], files: dict[tuple[str, str], str]) -> None:
        super().__init__(f"{len(sent)} part(s) composed")
        self.sent, self.files = sent, files


class _RecordingShell:
    def __init__(self, host: str, owner: _Recording) -> None:
        self.host, self.owner = host, owner

    def run(self, command: str, timeout: float, stdin: str = "") -> tuple[int, str, str]:
        if " ringflow.launch.supervisor run " in command:
            self.owner.sent.append(Sent(self.host, command, stdin))
            info = {"pid": 2, "pgid": 2, "supervisor_pid": 1}
            return 0, STARTED_PREFIX + json.dumps(info) + "\n", ""
        if " ringflow.launch.ports range" in command:  # Linux's default ephemeral range
            return 0, "32768 60999\n", ""
        if " ringflow.launch.ports check " in command:
            return 0, "free\n", ""
        if "/proc/meminfo" in command:  # a host with room for any job the examples make
            return 0, "MemTotal: 268435456 kB\nMemAvailable: 268435456 kB\n", ""
        return 0, "nothing to stop\n", ""  # earlier tries, ports, mpirun: all fine

    def stream(self, command, on_line, should_stop=lambda: False) -> int:
        raise AssertionError("a composition test never watches a job")

    def close(self) -> None:
        pass


class _Recording:
    """Mixed into a launcher backend: its hosts record instead of running."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Sent] = []
        self.files: dict[tuple[str, str], str] = {}

    def make_shell(self, host: str) -> _RecordingShell:
        return _RecordingShell(host, self)

    def on_every_host(self, work, what, hosts=None):
        """One host after the other: recording needs no thread pool (it was most of an
        example's time); a LaunchError is gathered as the real one gathers it."""
        from ringflow.errors import LaunchError, gathered

        results, problems = {}, []
        for host in dict.fromkeys(self.hosts if hosts is None else hosts):
            try:
                results[host] = work(host)
            except LaunchError as exc:
                problems.append(exc)
        if problems:
            raise gathered(what, problems)
        return results

    def prepare_hosts(self, *, numpy: bool = True, hosts=None) -> None:
        if isinstance(self, LocalLauncher):
            return super().prepare_hosts(numpy=numpy, hosts=hosts)
        for host in dict.fromkeys(self.hosts if hosts is None else hosts):
            self.runtimes[host] = Runtime(self.python, SHIPPED)
            self.homes[host] = HOME

    def put_file(self, host: str, path: str, text: str) -> None:
        self.files[(host, path)] = text

    def start(self, *args, **kwargs):
        super().start(*args, **kwargs)
        raise Composed(list(self.sent), dict(self.files))


class RecordingLocal(_Recording, LocalLauncher):
    pass


class RecordingSSH(_Recording, SSHLauncher):
    pass


class RecordingMpirun(_Recording, MpirunLauncher):
    pass


BACKENDS = {"local": RecordingLocal, "ssh": RecordingSSH, "mpirun": RecordingMpirun}


def recording_launcher(name: str, hosts: list[str], **kwargs):
    """`launchers.get_launcher`'s stand-in: the backend `name`, recording."""
    return BACKENDS[name](hosts, **kwargs)


def known_identity(mp: Any, operator_module: Any, token: str) -> None:
    """With MonkeyPatch `mp`: the job id and token `operator_module` makes (its `uuid.uuid4`,
    `token_source.token_hex`) are JOB_ID and `token`, so the commands a test expects are
    exact."""
    mp.setattr(operator_module, "uuid", types.SimpleNamespace(
        uuid4=lambda: uuid.UUID(JOB_ID + "0" * 20)))
    mp.setattr(operator_module, "token_source", types.SimpleNamespace(token_hex=lambda n: token))


def ssh_connections(mp: Any, *conn_ids: str) -> None:
    """With MonkeyPatch `mp`: ssh connections `conn_ids` (upper case) in the environment, to a
    host `h` as `u`: looked up by the operator, never connected to."""
    for conn_id in conn_ids:
        mp.setenv(f"AIRFLOW_CONN_{conn_id}", json.dumps({"conn_type": "ssh", "host": "h",
                                                         "login": "u"}))
