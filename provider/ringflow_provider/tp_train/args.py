"""TPTrainOperator's argument rules, without Airflow: numbers, env mappings, the hosts list
and its SSH connections, the launcher's name, the hosts' interpreter, the ports; and
`FormArgs`, the same rules as the pydantic model a trigger form's schema is made from."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ringflow import naming
from ringflow.errors import ConfigError
from ringflow_provider.launchers.job import ON_EXISTING
from ringflow_provider.rendered import json_text

LAUNCHERS = ("ssh", "mpirun")
DEFAULT_HEARTBEAT_TIMEOUT_S = 20.0
MAX_HEARTBEAT_TIMEOUT_S = 3600.0
#: a variable name as a POSIX shell takes it (`export NAME=...`, `unset NAME`)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: the hosts' python as `interpreter` takes it (searched, as JSON schema does): a command or
#: a path, never empty, an option (a leading '-') or a control character
PYTHON_PATTERN = r"^\s*[^\s\x00-\x1f-](?:[^\x00-\x1f]*[^\s\x00-\x1f])?\s*$"
#: one connection id (not blank); a mapping host -> id is not something a form offers
CONN_ID_PATTERN = r"\S"


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
        if not _ENV_NAME.match(key) or key.startswith(("PADDLE_", "RINGFLOW_")):
            raise ValueError(f"{name}: {key!r} is not a variable a job may set (names are "
                             f"[A-Za-z_][A-Za-z0-9_]*; PADDLE_* and RINGFLOW_* belong to the "
                             f"launcher)")
    values = {k: str(v) for k, v in value.items()}
    for key, text in values.items():  # a NUL cannot be in an environment (nor a command)
        if "\0" in text:
            raise ValueError(f"{name}: the value of {key} holds a NUL")
    return values


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
    if isinstance(value, str) and re.search(CONN_ID_PATTERN, value):
        return {h: value.strip() for h in hosts}
    if isinstance(value, Mapping):
        missing = [h for h in hosts if not str(value.get(h, "")).strip()]
        if missing:
            raise ValueError(f"ssh_conn_id names no connection for host(s) {', '.join(missing)}")
        return {h: str(value[h]).strip() for h in hosts}
    raise ValueError(f"ssh_conn_id must be a connection id or a mapping host -> id, got "
                     f"{value!r}")


def folder(name: str, template: Any, ids: Mapping[str, Any]) -> str:
    """A folder argument with its `{field}`s from `ids` filled in (`{dag_id}`, `{run_id}`,
    ...); ValueError naming the argument for any other field, a format spec or an
    attribute (str.format would read them), and for a folder an agent would read as an
    option or that holds a control character."""
    if not isinstance(template, str):
        raise ValueError(f"{name} must be a folder path, got {template!r}")
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template)
                  if f is not None]
    except ValueError as exc:
        raise ValueError(f"{name} {template!r}: {exc} (write a brace as {{{{ or }}}})") \
            from None
    for field, spec, conversion in fields:
        if field not in ids or spec or conversion:
            raise ValueError(f"{name} {template!r}: only the plain fields "
                             f"{', '.join('{' + k + '}' for k in ids)} are filled in")
    path = template.format(**ids)
    if path.startswith("-") or re.search(r"[\x00-\x1f\x7f]", path) or path == ":":
        raise ValueError(f"{name} {path!r}: a folder may not start with '-', be ':' or hold "
                         f"a control character (the agents read it on their command line)")
    return path


def launcher_name(value: Any) -> str:
    name = str(value or "ssh").strip()
    if name not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {value!r}")
    return name


def interpreter(value: Any) -> str:
    """The hosts' python: a command or a path, never something an option parser reads."""
    text = "" if value is None else str(value)
    if not re.search(PYTHON_PATTERN, text):
        raise ValueError(f"python must be an interpreter's name or path, got {value!r}")
    return text.strip()


def base_port(value: Any, nproc: int) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    port = positive_int(value, "base_port")
    if port < 1024 or port + nproc - 1 > 65535:
        raise ValueError(f"base_port {port}: the ranks' ports {port}..{port + nproc - 1} must "
                         f"lie in 1024..65535")
    return port


def heartbeat_timeout(value: Any) -> float:
    """Seconds of a peer's silence before a rank gives it up: > 0 and at most an hour."""
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_HEARTBEAT_TIMEOUT_S:
        raise ValueError(f"heartbeat_timeout must be a number of seconds in (0, "
                         f"{MAX_HEARTBEAT_TIMEOUT_S:g}], got {value!r}")
    return seconds


class FormArgs(BaseModel):
    """TPTrainOperator's arguments beyond the job spec, one plain value each (as a trigger
    form offers them), with the rules the functions above apply; the trigger form's schema
    is made from it (`ringflow_provider.tp_train.form`)."""

    # the patterns look ahead, as JSON schema may and Rust's regex cannot
    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    nproc_per_host: int = Field(2, ge=1, description="ranks (worker processes) on each host")
    hosts: str | None = Field(None, pattern=naming.HOSTS_PATTERN,
                              description="hostnames or IPv4 addresses, comma-separated; "
                                          "empty: this Airflow worker")
    ssh_conn_id: str = Field("ssh_default", pattern=CONN_ID_PATTERN,
                             description="the ssh connection that reaches the hosts")
    python: str = Field("python3", pattern=PYTHON_PATTERN,
                        description="the interpreter on the hosts")
    launcher: Literal[LAUNCHERS] = Field("ssh", description="ssh or mpirun")  # type: ignore[valid-type]
    base_port: int | None = Field(None, ge=1024, le=65535,
                                  description="the first rank port on every host")
    memory_check: bool = Field(True, description="refuse a job whose estimated memory "
                                                 "exceeds a host's MemAvailable")
    heartbeat_timeout: float = Field(DEFAULT_HEARTBEAT_TIMEOUT_S, gt=0,
                                     le=MAX_HEARTBEAT_TIMEOUT_S,
                                     description="seconds of a peer's silence before a rank "
                                                 "declares it lost")
    deferrable: bool = Field(False, description="hand the watch to Airflow's triggerer")
    poll_interval: float = Field(10.0, gt=0, description="seconds between the triggerer's "
                                                         "looks at the job")
    lease_timeout: float | None = Field(1800.0, gt=0, description="seconds a job runs on "
                                                                  "unwatched")
    on_existing: Literal[ON_EXISTING] = Field(  # type: ignore[valid-type]
        "reattach", description="reattach or restart the previous try's running job")
