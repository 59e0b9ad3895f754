"""TPTrainOperator's argument rules, without Airflow: numbers, env mappings, the hosts list
and its SSH connections, the launcher's name, the hosts' interpreter, the ports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringflow import naming
from ringflow.errors import ConfigError
from ringflow_provider.rendered import json_text

LAUNCHERS = ("ssh", "mpirun")


def positive_int(value: Any, name: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return number


def env_dict(value: Any, name: str) -> dict[str, str]:
    value = json_text(value, name) if isinstance(value, str) and value.strip() else (value or {})
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name} must be a mapping of variable names to values")
    for key in value:
        if not key.isidentifier() or key.startswith(("PADDLE_", "RINGFLOW_")):
            raise ValueError(f"{name}: {key!r} is not a variable a job may set (names are "
                             f"identifiers; PADDLE_* and RINGFLOW_* belong to the launcher)")
    return {k: str(v) for k, v in value.items()}


def host_list(value: Any) -> list[str]:
    """``hosts`` as given (a list, a comma string or its JSON text), checked by the
    launcher's own rule; [] for none."""
    value = json_text(value, "hosts") if isinstance(value, str) else value
    if value is None or value == "" or value == []:
        return []
    names = [h.strip() for h in (value.split(",") if isinstance(value, str) else value)]
    for name in names:
        try:
            naming.check_host(name)
        except ConfigError as exc:
            raise ValueError(f"hosts: {exc}") from None
    twice = sorted({h for h in names if names.count(h) > 1})
    if twice:
        raise ValueError(f"hosts: {', '.join(twice)} appears more than once (use "
                         f"nproc_per_host for several ranks on a host)")
    return names


def connections(value: Any, hosts: list[str]) -> dict[str, str]:
    """host -> ssh connection id: one id for every host, or a mapping naming each host."""
    value = json_text(value, "ssh_conn_id") if isinstance(value, str) else value
    if isinstance(value, str) and value.strip():
        return {h: value.strip() for h in hosts}
    if isinstance(value, Mapping):
        missing = [h for h in hosts if not str(value.get(h, "")).strip()]
        if missing:
            raise ValueError(f"ssh_conn_id names no connection for host(s) {', '.join(missing)}")
        return {h: str(value[h]).strip() for h in hosts}
    raise ValueError(f"ssh_conn_id must be a connection id or a mapping host -> id, got "
                     f"{value!r}")


def launcher_name(value: Any) -> str:
    name = str(value or "ssh").strip()
    if name not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {value!r}")
    return name


def interpreter(value: Any) -> str:
    """The hosts' python: a command or a path, never something an option parser reads."""
    text = str(value or "").strip()
    if not text or text.startswith("-") or any(ord(c) < 32 for c in text):
        raise ValueError(f"python must be an interpreter's name or path, got {value!r}")
    return text


def base_port(value: Any, nproc: int) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    port = positive_int(value, "base_port")
    if port < 1024 or port + nproc - 1 > 65535:
        raise ValueError(f"base_port {port}: the ranks' ports {port}..{port + nproc - 1} must "
                         f"lie in 1024..65535")
    return port
