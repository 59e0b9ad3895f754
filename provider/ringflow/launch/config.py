"""The launcher's command line, parsed into one validated, immutable LaunchConfig.

Validation happens here, before anything is started, and every problem is a ConfigError with
a one-line message. A plain dataclass, not pydantic: the runtime ships with numpy only.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ringflow.errors import ConfigError
from ringflow.naming import check_host

MAX_NPROC_PER_HOST = 1024
DEFAULT_GRACE_S = 5.0
DEFAULT_STDIN_TIMEOUT_S = 30.0
# A host name per RFC 1123 (labels of letters, digits and inner hyphens) or a dotted IPv4.
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


@dataclass(frozen=True)
class LaunchConfig:
    """What one launcher agent runs: its host's ranks of a job spread over `hosts`."""

    nproc_per_host: int
    target: str  # a script path, or a module name when `module` is true
    args: tuple[str, ...] = ()
    module: bool = False
    log_dir: Path = Path("log")
    base_port: int | None = None  # None: free ports picked on this host (single host only)
    hosts: tuple[str, ...] = ("127.0.0.1",)
    host_index: int = 0
    grace_s: float = DEFAULT_GRACE_S
    # --stdin: secrets from stdin's first line, and the end of stdin stops the job
    stdin: bool = False
    stdin_timeout_s: float = DEFAULT_STDIN_TIMEOUT_S

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def world_size(self) -> int:
        return self.nproc_per_host * len(self.hosts)

    @property
    def host(self) -> str:
        return self.hosts[self.host_index]

    def global_rank(self, local_rank: int) -> int:
        """Ranks are host-major: host i owns ranks i*N .. i*N+N-1."""
        return self.host_index * self.nproc_per_host + local_rank

    def command(self, python: str) -> list[str]:
        """The worker's argv; `-u` so a worker's lines reach the launcher as printed."""
        if self.module:
            return [python, "-u", "-m", self.target, *self.args]
        return [python, "-u", self.target, *self.args]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser(prog: str = "python -m ringflow.launch") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Start this host's ranks of a ringflow job, watch them, and stop them "
                    "all on the first failure.",
    )
    p.add_argument("--nproc-per-host", "--nproc_per_host", dest="nproc_per_host", type=int,
                   required=True, metavar="N", help="worker processes on this host")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", default="log", metavar="DIR",
                   help="per-rank logs DIR/workerlog.<global rank> (default: log)")
    p.add_argument("--base-port", dest="base_port", type=int, default=None, metavar="P",
                   help="rank with local rank i listens on P+i on its host (default: free "
                        "ports of this host; required with several hosts)")
    p.add_argument("--hosts", default=None, metavar="H1,H2",
                   help="every host of the job, comma-separated, in rank order")
    p.add_argument("--host-index", dest="host_index", type=int, default=None, metavar="I",
                   help="this host's position in --hosts")
    p.add_argument("--host-index-env", dest="host_index_env", default=None, metavar="VAR",
                   help="read the host index from environment variable VAR (for an agent "
                        "started by mpirun: OMPI_COMM_WORLD_RANK)")
    p.add_argument("--stdin", action="store_true",
                   help="read secret variables for the workers from stdin's first line (one "
                        "JSON object), then keep reading: when stdin ends, stop all ranks")
    p.add_argument("--stdin-timeout", dest="stdin_timeout", type=float, default=None,
                   metavar="S", help="seconds to wait for the --stdin line (default: "
                                     f"{DEFAULT_STDIN_TIMEOUT_S:g})")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module (python -m), not a script")
    p.add_argument("target", metavar="script.py|module", help="what each worker runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the worker")
    return p


def parse_launch_args(argv: list[str], prog: str = "python -m ringflow.launch",
                      cwd: Path | None = None,
                      environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Parse and validate; raises ConfigError naming the bad option and value."""
    ns = build_parser(prog).parse_args(argv)
    hosts = _parse_hosts(ns.hosts)
    if ns.host_index_env is not None:
        ns.host_index = _index_from_env(ns.host_index_env, ns.host_index,
                                        os.environ if environ is None else environ)
    config = LaunchConfig(
        nproc_per_host=ns.nproc_per_host,
        target=ns.target,
        args=tuple(ns.args),
        module=ns.module,
        log_dir=Path(ns.log_dir),
        base_port=ns.base_port,
        hosts=hosts,
        host_index=_host_index(ns.host_index, hosts, given=ns.hosts is not None),
        stdin=ns.stdin,
        stdin_timeout_s=_stdin_timeout(ns.stdin_timeout, ns.stdin),
    )
    validate(config, cwd or Path.cwd())
    return config


def validate(config: LaunchConfig, cwd: Path) -> None:
    """Check a config built in code the same way the CLI's is checked."""
    n = config.nproc_per_host
    if not 1 <= n <= MAX_NPROC_PER_HOST:
        raise ConfigError(f"--nproc-per-host must be between 1 and {MAX_NPROC_PER_HOST}, "
                          f"got {n}")
    if config.base_port is not None:
        last = config.base_port + n - 1
        if config.base_port < 1 or last > 65535:
            raise ConfigError(f"--base-port {config.base_port} with {n} ranks per host needs "
                              f"ports {config.base_port}..{last}, which must lie in 1..65535")
    elif len(config.hosts) > 1:
        raise ConfigError(f"--base-port is required with {len(config.hosts)} hosts: every "
                          "agent must compute every rank's endpoint (host:P+local rank) alone")
    if not config.grace_s > 0:
        raise ConfigError(f"the stop grace must be > 0 seconds, got {config.grace_s}")
    if not 0 < config.stdin_timeout_s < float("inf"):
        raise ConfigError(f"--stdin-timeout must be a positive number of seconds, "
                          f"got {config.stdin_timeout_s:g}")
    _validate_target(config, cwd)
    _validate_log_dir(config.log_dir if config.log_dir.is_absolute() else cwd / config.log_dir)


def _parse_hosts(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ("127.0.0.1",)
    hosts = tuple(h.strip() for h in text.split(","))
    for h in hosts:
        if not h:
            raise ConfigError(f"--hosts {text!r} has an empty entry; expected h1,h2,...")
        try:
            check_host(h)
        except ConfigError as exc:
            raise ConfigError(f"--hosts: {exc}") from None
    duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
    if duplicates:
        raise ConfigError(f"--hosts {text!r} names {', '.join(duplicates)} more than once; "
                          "use --nproc-per-host for several ranks on one host")
    return hosts


def _stdin_timeout(seconds: float | None, stdin: bool) -> float:
    if seconds is None:
        return DEFAULT_STDIN_TIMEOUT_S
    if not stdin:
        raise ConfigError("--stdin-timeout needs --stdin (it bounds the wait for stdin's "
                          "first line)")
    return seconds


def _index_from_env(var: str, index: int | None, environ: Mapping[str, str]) -> int:
    if index is not None:
        raise ConfigError("give --host-index or --host-index-env, not both")
    value = environ.get(var)
    if value is None:
        raise ConfigError(f"--host-index-env {var}: {var} is not set (is this agent started "
                          f"by mpirun?)")
    if not value.strip().isdigit():
        raise ConfigError(f"--host-index-env {var}: {var}={value!r} is not a host index")
    return int(value)


def _host_index(index: int | None, hosts: tuple[str, ...], given: bool) -> int:
    if index is None:
        if len(hosts) > 1:
            raise ConfigError(f"--host-index is required with {len(hosts)} hosts in --hosts")
        return 0
    if not given:
        raise ConfigError("--host-index needs --hosts (the list it indexes)")
    if not 0 <= index < len(hosts):
        raise ConfigError(f"--host-index must be in 0..{len(hosts) - 1} for --hosts "
                          f"{','.join(hosts)}, got {index}")
    return index


def _validate_target(config: LaunchConfig, cwd: Path) -> None:
    if config.module:
        if not _MODULE.match(config.target):
            raise ConfigError(f"-m expects a dotted module name, got {config.target!r}")
        return
    path = Path(config.target)
    path = path if path.is_absolute() else cwd / path
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(f"script {config.target!r} {what} (looked in {cwd})")


def _validate_log_dir(path: Path) -> None:
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--log-dir {path} cannot be created: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--log-dir {path} cannot be written: {probe} is not writable")
