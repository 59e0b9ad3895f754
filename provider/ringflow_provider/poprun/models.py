"""Pydantic boundary models of the provider: PopRunConfig, the validated PopRun job.

Each field's type carries its own checks (so one field can be validated alone, as the
operator does for literal arguments at DAG parse time); the cross-field rules of the seed
(divisibility of IPUs, replicas and instances) live in the model validator.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ringflow import naming
from ringflow.errors import ConfigError
from ringflow_provider.jobs.masking import is_hidden
from ringflow_provider.jobs.unsafe import check_env, check_mpirun_args
from ringflow_provider.rendered import json_text, none_text

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "FOO\n" is no name
# mpirun's `-x NAME=VALUE` and --mpi-global-args tokens sit inside whitespace-separated poprun
# option values that poprun hands on to mpirun: an allow-list of characters no shell or
# option parser gives a meaning to. Other values go through secret_env (never parsed).
MPI_VALUE_PUNCTUATION = "_.,:/@%+=~^-"  # '-' last: a literal in the character class
_MPI_SAFE = re.compile(rf"^[A-Za-z0-9{MPI_VALUE_PUNCTUATION}]*\Z")
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
# poprun flags the composition emits itself (`compose.build_poprun_argv`; -H is --host's
# short form): extra_poprun_args may not give them again, since poprun keeps the last.
OWNED_FLAGS = frozenset({
    "--num-instances", "--num-replicas", "--ipus-per-replica", "--host", "-H",
    "--vipu-partition", "--vipu-server-host", "--update-partition", "--vipu-server-timeout",
    "--print-topology", "--numa-aware", "--mpi-global-args", "--mpi-local-args",
    "--instance-mpi-local-args",
})
#: arguments that only the DAG author decides: never templated (a trigger's params cannot
#: turn them on), never offered by a form
ALLOW_FIELDS = ("allow_unsafe_mpi_args", "allow_unsafe_env")


def _parse_hosts(value: Any) -> Any:
    value = json_text(value, "hosts")
    if isinstance(value, str):
        return [part.strip() for part in value.split(",")]
    if isinstance(value, list):
        return [part.strip() if isinstance(part, str) else part for part in value]
    return value


def check_host(host: str) -> str:
    """A host is a hostname or an IPv4 address, nothing else: the launcher's own rule
    (`ringflow.naming.check_host`), as a ValueError for pydantic."""
    try:
        return naming.check_host(host)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


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
    if not _MPI_SAFE.match(value):
        raise ValueError(
            f"{what}={value!r}: values passed on mpirun's command line take letters, digits "
            f"and {MPI_VALUE_PUNCTUATION} only (pass other values in secret_env)"
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
        if is_hidden(name, value):  # travels over stdin, a bare -x NAME on the command line
            _check_stdin_value(value, f"extra_env {name}")
        else:
            check_mpi_value(value, name)
    return env


def _check_stdin_value(value: str, what: str) -> None:
    """A value sent as one line on the SSH channel's stdin; the message never quotes it."""
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"{what}: the value holds a line break or NUL")


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
        _check_stdin_value(value, f"secret_env {name}")
    return env


def _check_flags(flags: list[str]) -> list[str]:
    seen: set[str] = set()
    for flag in flags:
        if not flag.startswith("-"):
            raise ValueError(
                f"extra_poprun_args item {flag!r} is not a flag: write options as "
                "'--name=value' so nothing can be taken for the program"
            )
        if _CONTROL.search(flag):
            raise ValueError(f"extra_poprun_args item {flag!r} holds a control character")
        name = flag.partition("=")[0]
        if name in OWNED_FLAGS:
            raise ValueError(
                f"extra_poprun_args item {flag!r}: {name} is composed from the operator's "
                f"own arguments (hosts, nproc_per_host, num_ipus, mpi_global_args, "
                f"extra_env, ...); set those instead")
        if name in seen and name != "--":
            raise ValueError(f"extra_poprun_args gives {name} more than once (poprun would "
                             f"keep only the last)")
        seen.add(name)
    return flags


def _check_not_separator(args: list[str], what: str) -> None:
    """Open MPI's mpirun (under poprun) reads a `:` token as the start of another program."""
    if ":" in args:
        raise ValueError(f"{what}: a ':' item would make mpirun start another program")


def _check_mpi_args(args: list[str]) -> list[str]:
    for arg in args:
        check_mpi_value(arg, "mpi_global_args item")
    _check_not_separator(args, "mpi_global_args")
    return args


def _check_text(value: str) -> str:
    if not value.strip():
        raise ValueError("expected a non-empty string")
    if _CONTROL.search(value):
        raise ValueError(f"{value!r} holds a control character")
    return value


def _check_program(value: str) -> str:
    """An executable or a script: never taken for an option of the command before it."""
    _check_text(value)
    _check_not_separator([value], repr(value))
    if value.lstrip().startswith("-"):
        raise ValueError(f"{value!r} starts with '-', so it would be read as an option; "
                         f"give a path (./{value.strip()})")
    return value


def _check_args(args: list[str]) -> list[str]:
    for arg in args:
        if _CONTROL.search(arg):  # a line break in an argument forges log lines
            raise ValueError(f"training_script_args item {arg!r} holds a control character")
    _check_not_separator(args, "training_script_args")
    return args


Text = Annotated[str, AfterValidator(_check_text)]
Program = Annotated[str, AfterValidator(_check_program)]
Count = Annotated[int, Field(ge=1)]
Hosts = Annotated[list[str], BeforeValidator(_parse_hosts), AfterValidator(_check_hosts)]
ArgList = Annotated[list[str], BeforeValidator(lambda v: json_text(v, "list")),
                    AfterValidator(_check_args)]
Env = Annotated[
    dict[str, str] | None,
    BeforeValidator(lambda v: json_text(none_text(v), "extra_env")),
    AfterValidator(lambda v: None if v is None else _check_env(v)),
]
SecretEnv = Annotated[
    dict[str, str] | None,
    BeforeValidator(lambda v: json_text(none_text(v), "secret_env")),
    AfterValidator(lambda v: None if v is None else _check_secret_env(v)),
]
Flags = Annotated[
    list[str] | None,
    BeforeValidator(lambda v: json_text(none_text(v), "extra_poprun_args")),
    AfterValidator(lambda v: None if v is None else _check_flags(v)),
]
MpiArgs = Annotated[
    list[str] | None,
    BeforeValidator(lambda v: json_text(none_text(v), "mpi_global_args")),
    AfterValidator(lambda v: None if v is None else _check_mpi_args(v)),
]
LogLevel = Annotated[
    str | None,
    BeforeValidator(none_text),
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
    training_script: Program
    training_script_args: ArgList = []
    python: Program = "python3"
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
    poprun: Program = "poprun"
    allow_unsafe_mpi_args: bool = False
    allow_unsafe_env: bool = False

    @property
    def num_instances(self) -> int:
        return len(self.hosts) * self.nproc_per_host

    @property
    def num_replicas(self) -> int:
        return self.num_ipus // self.ipus_per_replica

    @field_validator("endpoint_port")
    @classmethod
    def _ports_fit(cls, port: int, info: ValidationInfo) -> int:
        """Instance i of a host listens on endpoint_port + i: the last must be a port."""
        nproc = info.data.get("nproc_per_host")  # absent when it failed its own checks
        if nproc is not None and port + nproc - 1 > 65535:
            raise ValueError(f"{port} with nproc_per_host={nproc} gives the instances ports "
                             f"{port}..{port + nproc - 1}, beyond 65535")
        return port

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
        check_env(self.extra_env, "extra_env", self.allow_unsafe_env)
        check_env(self.secret_env, "secret_env", self.allow_unsafe_env)
        check_mpirun_args(self.mpi_global_args or [], "mpi_global_args",
                          self.allow_unsafe_mpi_args)
        check_mpirun_args(self.extra_poprun_args or [], "extra_poprun_args",
                          self.allow_unsafe_mpi_args)
        return self

    def secret_env_names(self) -> list[str]:
        """extra_env names whose values must never reach a log or a command line
        (jobs.masking's rule: a secret name, or a URL's password in the value)."""
        return [name for name, value in (self.extra_env or {}).items()
                if is_hidden(name, value)]

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


#: the fields PopRunOperator templates: all but ALLOW_FIELDS
FIELD_NAMES: tuple[str, ...] = tuple(n for n in PopRunConfig.model_fields
                                     if n not in ALLOW_FIELDS)
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
