"""Backend `ssh`: a ringflow launcher agent on every host, each started over SSH under the
host's own supervisor. Also what every remote backend shares: hosts reached through `ssh`
connections, checked and given the runtime, a port range free on all of them (below each
one's ephemeral range), files written over SFTP."""

from __future__ import annotations

import random
import shlex
from collections.abc import Mapping, Sequence

from ringflow.errors import LaunchError
from ringflow.launch import ports
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.base import Launcher
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.shells import Shell, SSHShell
from ringflow_provider.launchers.shipping import prepare_hosts

_PORT_TRIES = 8
PORTS_MODULE = "ringflow.launch.ports"


class SSHLauncher(Launcher):
    name = "ssh"

    def __init__(self, hosts: Sequence[str], *, conns: Mapping[str, str], **kwargs) -> None:
        missing = [h for h in hosts if not conns.get(h)]
        if missing:
            raise LaunchError(f"no ssh connection named for host(s) {', '.join(missing)}")
        super().__init__(hosts, conns=conns, **kwargs)
        self._hooks: dict[str, MultiHostSSHHook] = {}

    def hook(self, host: str) -> MultiHostSSHHook:
        conn_id = self.conns[host]
        if conn_id not in self._hooks:
            self._hooks[conn_id] = MultiHostSSHHook(conn_id, self.conn_timeout)
        return self._hooks[conn_id]

    def check_allowed(self) -> None:
        """Every host of the job (also those that mpirun or poprun reach from the first)
        against the ``allowed_hosts`` of its connection, before any is connected."""
        for conn_id in dict.fromkeys(self.conns[h] for h in self.hosts):
            hosts = [h for h in self.hosts if self.conns[h] == conn_id]
            self.hook(hosts[0]).check_allowed(hosts)

    def make_shell(self, host: str) -> Shell:
        return SSHShell(host, self.hook(host))

    def prepare_hosts(self, *, numpy: bool = True, hosts: Sequence[str] | None = None
                      ) -> None:
        """Preflight (interpreter, numpy unless not needed) and the runtime shipped, on every
        host at once; each host's home (relative paths of the job are under it)."""
        targets = list(dict.fromkeys(self.hosts if hosts is None else hosts))
        prepared = prepare_hosts({h: self.hook(h) for h in targets}, targets, self.python,
                                 numpy=numpy)
        for host in targets:
            self.log.info("%s", prepared[host].describe())
            self.runtimes[host] = Runtime(self.python, prepared[host].shipped.pythonpath)
        homes = self.on_every_host(lambda h: self.run(h, commands.home_command())[1],
                                   "finding $HOME", targets)
        self.homes.update({h: home.strip() for h, home in homes.items()})

    def absolute(self, path: str | None, host: str | None = None) -> str | None:
        """A path the job saw relative to its working folder (the login's home), as an
        absolute path of `host` (default: the first)."""
        if not path or path.startswith("/"):
            return path
        home = self.homes.get(host or self.hosts[0], "~")
        return f"{home.rstrip('/')}/{path}"

    def agent_parts(self, agent_args: Sequence[str], *, nproc_per_host: int, log_dir: str,
                    base_port: int | None, env: Mapping[str, str]
                    ) -> list[tuple[str, list[str]]]:
        if base_port is None:
            raise LaunchError("the agents of several hosts need a base port")
        return [(host, [self.python, "-m", "ringflow.launch", "--stdin", "--nproc-per-host",
                        str(nproc_per_host), "--hosts", ",".join(self.hosts), "--host-index",
                        str(index), "--base-port", str(base_port), "--log-dir", log_dir,
                        *agent_args])
                for index, host in enumerate(self.hosts)]

    def free_base_port(self, count: int) -> int | None:
        """A base port of `count` ports free on every host and below every host's ephemeral
        range (`ringflow.launch.ports`, run with the shipped runtime: after `prepare`)."""
        said = self.on_every_host(lambda h: self.run(h, self.runtime(h).module(
            PORTS_MODULE, "range")), "reading the ephemeral port ranges")
        lows = {}
        for host, (code, out, err) in said.items():
            try:
                lows[host] = int(out.split()[0])
            except (IndexError, ValueError):
                raise LaunchError(f"host {host!r}: cannot read its ephemeral port range "
                                  f"(exit {code}): {(err or out).strip()}") from None
        host = min(lows, key=lows.__getitem__)
        first, last = ports.base_window(count, lows[host], f"host {host!r}")
        rng = random.Random()
        for _ in range(_PORT_TRIES):
            base = rng.randint(first, last)
            found = self.on_every_host(lambda h, base=base: self.run(h, self.runtime(h).module(
                PORTS_MODULE, "check", str(base), str(count))), "looking for free ports")
            if all(code == 0 for code, _, _ in found.values()):
                self.log.info("ports %d-%d are free on every host (below every host's "
                              "ephemeral range, the lowest from %d on %s)", base,
                              base + count - 1, lows[host], host)
                return base
        raise LaunchError(f"no range of {count} ports free on every host of "
                          f"{','.join(self.hosts)} below {lows[host]} (the ephemeral range of "
                          f"{host}) after {_PORT_TRIES} tries; pass base_port")

    def put_file(self, host: str, path: str, text: str) -> None:
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        code, _, err = self.run(host, f"cd && umask 077 && mkdir -p {shlex.quote(folder)}")
        if code != 0:
            raise LaunchError(f"host {host!r}: cannot make {folder}: {err.strip()}")
        sftp = self.hook(host).open_sftp(host)
        try:
            with sftp.open(path, "w") as f:
                f.chmod(0o600)
                f.write(text)
        except OSError as exc:
            raise LaunchError(f"host {host!r}: cannot write {path}: {exc}") from exc
        finally:
            sftp.close()

    def close(self) -> None:
        super().close()
        for hook in self._hooks.values():
            hook.close()
        self._hooks.clear()
