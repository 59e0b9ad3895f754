"""Secrets for the processes of an mpirun job, delivered to each host over that host's own SSH
connection, because Open MPI carries `-x` variables to its remote daemons over its own
unencrypted TCP.

Before mpirun starts, every host gets a folder (0700, a random name under /tmp) holding one
file (0600) per process that runs there, named by its MPI rank: shell `export` lines of
the secret variables. The sh that Open MPI starts each process under (`openmpi.INSTANCE_SH`)
sources its file and removes it, so each file is read once; whatever is left (a process
that never started) is removed with the folder when the job ends. The values are never on
a command line (they go on ssh's stdin) and never in the job's own folders.
"""

from __future__ import annotations

import contextlib
import os
import secrets as token_source
import shlex
import shutil
import socket
import subprocess
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from ringflow.errors import LaunchError

SECRETS_DIR_VAR = "RINGFLOW_SECRETS_DIR"
DROP_TIMEOUT_S = 30.0
_SSH_OPTIONS = ["-o", "BatchMode=yes"]


def export_lines(values: Mapping[str, str]) -> bytes:
    """The file a process's sh sources: one quoted `export` per variable."""
    return "".join(f"export {name}={shlex.quote(value)}\n"
                   for name, value in values.items()).encode()


def is_this_host(host: str) -> bool:
    """Whether `host` names this machine (an address of it can be bound here)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, address in infos:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address[0], 0))
            return True
    return False


def rsh_command(environ: Mapping[str, str]) -> list[str]:
    """How Open MPI reaches the other hosts (its plm_rsh_agent and plm_rsh_args, default
    ssh): the same way, so the same keys and options serve."""
    agent = environ.get("OMPI_MCA_plm_rsh_agent", "ssh").split(":")[0].strip() or "ssh"
    return [*shlex.split(agent), *shlex.split(environ.get("OMPI_MCA_plm_rsh_args", "")),
            *_SSH_OPTIONS]


class SecretDrop:
    """One job's secret files on its hosts: `deliver()` before mpirun, `remove()` after."""

    def __init__(self, ranks_by_host: Mapping[str, Sequence[int]], values: Mapping[str, str],
                 environ: Mapping[str, str], job_id: str) -> None:
        self.ranks_by_host = {h: list(r) for h, r in ranks_by_host.items()}
        self.values = dict(values)
        self.rsh = rsh_command(environ)
        self.folder = f"/tmp/ringflow-secrets-{job_id}-{token_source.token_hex(8)}"
        self._delivered: list[str] = []

    def deliver(self) -> None:
        """Every host's files, or a LaunchError naming the host (what was delivered is
        removed again)."""
        data = export_lines(self.values)
        try:
            for host, ranks in self.ranks_by_host.items():
                self._deliver(host, ranks, data)
                self._delivered.append(host)
        except LaunchError:
            self.remove()
            raise

    def _deliver(self, host: str, ranks: list[int], data: bytes) -> None:
        if is_this_host(host):
            os.makedirs(self.folder, 0o700, exist_ok=True)  # a random name: ours
            for rank in ranks:
                fd = os.open(f"{self.folder}/{rank}", os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                             0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            return
        d = shlex.quote(self.folder)
        script = (f"umask 077 && mkdir {d} && cat > {d}/.in && "
                  f"for r in {' '.join(map(str, ranks))}; do cp {d}/.in {d}/$r || exit 1; "
                  f"done && rm -f {d}/.in")
        self._ssh(host, script, data, "deliver the job's secrets")

    def _ssh(self, host: str, script: str, data: bytes, what: str) -> None:
        try:
            done = subprocess.run([*self.rsh, host, script], input=data, capture_output=True,
                                  timeout=DROP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"cannot {what} to {host} over {self.rsh[0]}: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])
            raise LaunchError(f"cannot {what} to {host} over {self.rsh[0]} (exit "
                              f"{done.returncode}): {said[-1]}")

    def remove(self, lost: Collection[str] = ()) -> list[str]:
        """Remove the folder on every host it was delivered to; what could not be (best
        effort: the processes that read their files removed them already). Hosts in `lost`
        (given up as unreachable) are not waited for: named as not done."""
        failed = [f"cannot remove the secrets folder on {host}: it was given up as lost (its "
                  "processes removed their files when they read them)"
                  for host in self._delivered if host in lost]
        for host in [h for h in self._delivered if h not in lost]:
            if is_this_host(host):
                shutil.rmtree(Path(self.folder), ignore_errors=True)
                continue
            try:
                self._ssh(host, f"rm -rf {shlex.quote(self.folder)}", b"", "remove the secrets")
            except LaunchError as exc:
                failed.append(str(exc))
        self._delivered.clear()
        return failed
