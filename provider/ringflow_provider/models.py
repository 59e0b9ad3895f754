"""Pydantic boundary models of the provider: PopRunConfig, the validated PopRun job.

Each field's type carries its own checks (so one field can be validated alone, as the
operator does for literal arguments at DAG parse time); the cross-field rules of the seed
(divisibility of IPUs, replicas and instances) live in the model validator.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    model_validator,
)

from ringflow_provider.jobs.masking import is_secret_name

_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# mpirun's `-x NAME=VALUE` sits inside one whitespace-separated poprun option value
# (`--mpi-local-args`), so a value cannot hold whitespace, quotes or backslashes.
_MPI_UNSAFE = re.compile(r"[\s'\"\\`]|[\x00-\x1f\x7f]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Names the composition sets itself; a user value would contradict it.
RESERVED_ENV = frozenset(
    {
        "POPART_LOG_LEVEL",
        "PADDLE_TRAINERS_NUM",
        "PADDLE_TRAINER_ENDPOINTS",
        "PADDLE_TRAINER_ID",
        "PADDLE_CURRENT_ENDPOINT",
        "PADDLE_RANK_IN_NODE",
    }
)


def _json_text(value: Any, what: str) -> Any:
    """A template renders lists and dicts to text: accept their JSON form."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what}: expected JSON text, got {value!r} ({exc.msg})") from None
    return value


def _none_text(value: Any) -> Any:
    """An optional field rendered from a None param arrives as '' or 'None'."""
    if isinstance(value, str) and value.strip() in ("", "None", "null"):
        return None
    return value


def _parse_hosts(value: Any) -> Any:
    value = _json_text(value, "hosts")
    if isinstance(value, str):
        return [part.strip() for part in value.split(",")]
    if isinstance(value, list):
        return [part.strip() if isinstance(part, str) else part for part in value]
    return value


def check_host(host: str) -> str:
    """A host is a hostname or an IPv4 address, nothing else."""
    if not host:
        raise ValueError("empty host name (a doubled, leading or trailing comma?)")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    if addr is not None:
        if addr.version == 6:
            raise ValueError(f"host {host!r}: IPv6 addresses cannot form host:port endpoints")
        return host
    labels = host.split(".")
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise ValueError(f"host {host!r} is not a hostname or IPv4 address")
    return host


def _check_hosts(hosts: list[str]) -> list[str]:
    if not hosts:
        raise ValueError("hosts: expected at least one host, got none")
    for host in hosts:
        try:
            check_host(host)
        except ValueError as exc:
            raise ValueError(f"{exc} in hosts {','.join(hosts)!r}") from None
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            raise ValueError(f"host {host!r} appears more than once in {','.join(hosts)!r}")
        seen.add(host)
    return hosts


def check_mpi_value(value: str, what: str) -> str:
    if _MPI_UNSAFE.search(value):
        raise ValueError(
            f"{what}={value!r}: mpirun's -x cannot carry whitespace, quotes, backslashes, "
            "backticks or control characters"
        )
    return value


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ValueError(
                f"extra_env name {name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if name in RESERVED_ENV:
            raise ValueError(f"extra_env name {name!r} is set by the composition itself")
        check_mpi_value(value, name)
    return env


def _check_secret_env(env: dict[str, str]) -> dict[str, str]:
    """secret_env values travel as one line each on the SSH channel's stdin and reach mpirun
    as a bare `-x NAME`: any character but a line break or NUL. Messages never quote them."""
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ValueError(
                f"secret_env name {name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if name in RESERVED_ENV or name.startswith("RINGFLOW_"):
            raise ValueError(f"secret_env name {name!r} is set by the composition itself")
        if any(c in value for c in "\n\r\0"):
            raise ValueError(f"secret_env {name}: the value holds a line break or NUL")
    return env


def _check_flags(flags: list[str]) -> list[str]:
    for flag in flags:
        if not flag.startswith("-"):
            raise ValueError(
                f"extra_poprun_args item {flag!r} is not a flag: write options as "
                "'--name=value' so nothing can be taken for the program"
            )
        if _CONTROL.search(flag):
            raise ValueError(f"extra_poprun_args item {flag!r} holds a control character")
    return flags


def _check_mpi_args(args: list[str]) -> list[str]:
    for arg in args:
        check_mpi_value(arg, "mpi_global_args item")
    return args


def _check_text(value: str) -> str:
    if not value.strip():
        raise ValueError("expected a non-empty string")
    if _CONTROL.search(value):
        raise ValueError(f"{value!r} holds a control character")
    return value


Text = Annotated[str, AfterValidator(_check_text)]
Count = Annotated[int, Field(ge=1)]
Hosts = Annotated[list[str], BeforeValidator(_parse_hosts), AfterValidator(_check_hosts)]
ArgList = Annotated[list[str], BeforeValidator(lambda v: _json_text(v, "list"))]
Env = Annotated[
    dict[str, str] | None,
    BeforeValidator(lambda v: _json_text(_none_text(v), "extra_env")),
    AfterValidator(lambda v: None if v is None else _check_env(v)),
]
SecretEnv = Annotated[
    dict[str, str] | None,
    BeforeValidator(lambda v: _json_text(_none_text(v), "secret_env")),
    AfterValidator(lambda v: None if v is None else _check_secret_env(v)),
]
Flags = Annotated[
    list[str] | None,
    BeforeValidator(lambda v: _json_text(_none_text(v), "extra_poprun_args")),
    AfterValidator(lambda v: None if v is None else _check_flags(v)),
]
MpiArgs = Annotated[
    list[str] | None,
    BeforeValidator(lambda v: _json_text(_none_text(v), "mpi_global_args")),
    AfterValidator(lambda v: None if v is None else _check_mpi_args(v)),
]
LogLevel = Annotated[
    str | None,
    BeforeValidator(_none_text),
    AfterValidator(lambda v: None if v is None else check_mpi_value(v, "POPART_LOG_LEVEL")),
]


class PopRunConfig(BaseModel):
    """One PopRun job: what Paddle's IPUController took from its command line, made explicit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: Hosts
    nproc_per_host: Count
    ipus_per_replica: Count
    num_ipus: Count
    ipu_partition: Text
    vipu_server: Text
    training_script: Text
    training_script_args: ArgList = []
    python: Text = "python3"
    popart_log_level: LogLevel = None
    endpoint_port: Annotated[int, Field(ge=1, le=65535)] = 8090
    update_partition: bool = False
    vipu_server_timeout: Count = 120
    print_topology: bool = True
    numa_aware: bool = True
    mpi_global_args: MpiArgs = None
    extra_poprun_args: Flags = None
    extra_env: Env = None
    secret_env: SecretEnv = None
    poprun: Text = "poprun"

    @property
    def num_instances(self) -> int:
        return len(self.hosts) * self.nproc_per_host

    @property
    def num_replicas(self) -> int:
        return self.num_ipus // self.ipus_per_replica

    @model_validator(mode="after")
    def _divisible(self) -> PopRunConfig:
        if self.num_ipus % self.ipus_per_replica:
            raise ValueError(
                f"num_ipus={self.num_ipus} is not divisible by "
                f"ipus_per_replica={self.ipus_per_replica}"
            )
        if self.num_replicas % self.num_instances:
            raise ValueError(
                f"num_replicas={self.num_replicas} (num_ipus {self.num_ipus} / ipus_per_replica "
                f"{self.ipus_per_replica}) is not divisible by num_instances="
                f"{self.num_instances} ({len(self.hosts)} hosts x nproc_per_host "
                f"{self.nproc_per_host})"
            )
        clash = sorted(set(self.extra_env or {}) & set(self.secret_env or {}))
        if clash:
            raise ValueError(f"{', '.join(clash)} in both extra_env and secret_env")
        return self

    def secret_env_names(self) -> list[str]:
        """extra_env names whose values must never reach a log (jobs.masking's rule)."""
        return [name for name in (self.extra_env or {}) if is_secret_name(name)]

    def hidden_env(self) -> dict[str, str]:
        """The variables whose values travel over stdin, never a command line: extra_env's
        under secret names, and every secret_env one."""
        env = self.extra_env or {}
        return {**{name: env[name] for name in self.secret_env_names()},
                **(self.secret_env or {})}

    def plain_env(self) -> dict[str, str]:
        """extra_env's other variables: exported as quoted text, `-x NAME=VALUE` for mpirun."""
        hidden = set(self.secret_env_names())
        return {k: v for k, v in (self.extra_env or {}).items() if k not in hidden}


FIELD_NAMES: tuple[str, ...] = tuple(PopRunConfig.model_fields)
_FIELD_ADAPTERS: dict[str, TypeAdapter] = {}


def validate_field(name: str, value: Any) -> Any:
    """Validate one PopRunConfig field alone (no cross-field rules)."""
    if name not in _FIELD_ADAPTERS:
        info = PopRunConfig.model_fields[name]
        annotated = info.annotation
        if info.metadata:
            annotated = Annotated.__class_getitem__((info.annotation, *info.metadata))
        _FIELD_ADAPTERS[name] = TypeAdapter(annotated)
    return _FIELD_ADAPTERS[name].validate_python(value)
