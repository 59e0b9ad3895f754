"""The hosts an `ssh` connection may reach: its extra ``allowed_hosts``, read once into
`AllowedHosts` and checked before any SSH connection is opened, by the hook that every
launcher uses (`multi_ssh.MultiHostSSHHook`), by the launchers for every host of a job
(also those Open MPI's mpirun or poprun reach from the first host) and by the deferrable
trigger before it (re)connects. No paramiko here: the trigger and the launchers' base import
it.

The extra is a JSON list or a comma-separated string of entries; each is a host name or
IPv4 address (compared as written, case-insensitively: no DNS lookup, so a name does not
allow its address nor the reverse), a pattern matched label by label with `fnmatch`
(``10.77.0.*`` allows ``10.77.0.5`` but not ``10.77.0.5.example.com``; ``*.train.example``
one label under it), or an IPv4 network (``10.77.0.0/24``). Without the extra every host is
allowed, as before; an empty list allows none.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ringflow.errors import LaunchError

EXTRA = "allowed_hosts"
_GLOB = frozenset("*?[")


class HostNotAllowedError(LaunchError):
    """A host is not among the `allowed_hosts` of the connection that would reach it (or
    that extra cannot be read); the task fails without retries
    (`exceptions.RingflowHostNotAllowedException`)."""


class AllowedHosts(BaseModel):
    """A connection's ``allowed_hosts``; `entries` None: the extra is not set (any host)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entries: tuple[str, ...] | None = None

    @field_validator("entries", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.split(",")
        if not isinstance(value, (list, tuple)) or not all(isinstance(e, str) for e in value):
            raise ValueError("expected a JSON list of host names, patterns or networks, or "
                             "one comma-separated string of them")
        entries = tuple(e.strip().lower() for e in value if e.strip())
        for entry in entries:
            if "/" in entry:
                ipaddress.IPv4Network(entry, strict=False)  # ValueError names the entry
        return entries

    @classmethod
    def of(cls, conn_id: str, extra: Mapping[str, Any]) -> AllowedHosts:
        """What the extra of connection `conn_id` says; HostNotAllowedError naming the
        connection when it cannot be read (a refusal, never 'any host')."""
        if EXTRA not in extra:
            return cls()
        try:
            return cls(entries=extra[EXTRA])
        except (ValidationError, ValueError) as exc:
            errors = exc.errors() if isinstance(exc, ValidationError) else [{"msg": str(exc)}]
            said = "; ".join(e["msg"] for e in errors)
            raise HostNotAllowedError(
                f"ssh connection {conn_id!r}: its extra {EXTRA} cannot be read ({said}), so "
                f"no host is reached with it") from None

    def permits(self, host: str) -> bool:
        if self.entries is None:
            return True
        host = host.strip().lower()
        return any(_matches(entry, host) for entry in self.entries)

    def check(self, hosts: Iterable[str], conn_id: str) -> None:
        """HostNotAllowedError naming the first host of `hosts` this list does not allow,
        the connection and the extra."""
        refused = [h for h in dict.fromkeys(hosts) if not self.permits(h)]
        if refused:
            which = (f"host {refused[0]!r} is" if len(refused) == 1
                     else f"hosts {', '.join(map(repr, refused))} are")
            raise HostNotAllowedError(
                f"{which} not allowed by ssh connection "
                f"{conn_id!r}: its extra {EXTRA} is {json.dumps(list(self.entries or ()))}; "
                f"nothing was started and no SSH connection was opened (add the host to "
                f"{EXTRA}, or choose another host)")


def _matches(entry: str, host: str) -> bool:
    if "/" in entry:
        try:
            return ipaddress.IPv4Address(host) in ipaddress.IPv4Network(entry, strict=False)
        except ValueError:  # a host name is never in a network: no DNS lookup
            return False
    if not _GLOB & set(entry):
        return entry == host
    labels, wanted = host.split("."), entry.split(".")
    return len(labels) == len(wanted) and all(fnmatchcase(label, pattern) for label, pattern
                                              in zip(labels, wanted))
