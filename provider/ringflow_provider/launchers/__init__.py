"""Launching a job on hosts: one `Launcher` interface (`base`), backends registered by name.

A backend is a module with a `Launcher` subclass and one line below; operators pick one by
name (`launcher="ssh"`) and never branch on it. Backends import paramiko and Airflow's SSH
provider only when they are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringflow_provider.launchers.base import Launcher
    from ringflow_provider.launchers.job import JobHandle

#: name -> "module:class" of each backend
BACKENDS: dict[str, str] = {
    "local": "ringflow_provider.launchers.local:LocalLauncher",
    "ssh": "ringflow_provider.launchers.ssh:SSHLauncher",
    "mpirun": "ringflow_provider.launchers.mpirun:MpirunLauncher",
}
#: the backends a job on remote hosts can name (`local` is chosen by giving no hosts)
REMOTE = ("ssh", "mpirun")


def launcher_class(name: str) -> type[Launcher]:
    try:
        module, cls = BACKENDS[name].split(":")
    except KeyError:
        raise ValueError(f"launcher must be one of {', '.join(BACKENDS)}, got {name!r}") \
            from None
    return getattr(importlib.import_module(module), cls)


def get_launcher(name: str, hosts: list[str], **kwargs: Any) -> Launcher:
    """A launcher of backend `name` for `hosts` (see `Launcher.__init__` for the rest)."""
    return launcher_class(name)(hosts, **kwargs)


def launcher_for(handle: JobHandle, log: Any, **kwargs: Any) -> Launcher:
    """A launcher that can watch and stop the job of `handle` (no preparation needed)."""
    conns = {p.host: p.conn_id for p in handle.parts if p.conn_id}
    args: dict[str, Any] = {"log": log, "python": handle.python, **kwargs}
    if conns:
        args["conns"] = conns
    hosts = [p.host for p in handle.parts]
    return get_launcher(handle.launcher, hosts, **args)
