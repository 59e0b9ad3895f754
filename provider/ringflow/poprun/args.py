"""poprun's command line, parsed into a validated PopRunArgs: `poprun [options] program [args]`.

Options are `--name=value` or `--name value` (`-H`/`-v` short forms too), until the first
token that is not an option, or `--`. The flags are Graphcore poprun's; those that only mean
something on an IPU system are accepted and reported as ignored; any other flag is an error
that names it, and so is an option given twice (poprun's parser would silently keep the
last: a second `--mpi-global-args` could replace the first).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ringflow.errors import ConfigError
from ringflow.launch.openmpi import check_no_separator
from ringflow.naming import check_host

__all__ = ["IPU_ONLY", "HelpRequested", "PopRunArgs", "parse_poprun_args", "usage"]

_TRUE = {"yes", "true", "on", "1"}
_FALSE = {"no", "false", "off", "0"}
BOOL_WORDS = _TRUE | _FALSE

# Flags a CPU run takes as given but cannot act on (no IPUs, no V-IPU server, no NUMA
# placement of IPU links); a value is still checked for its type.
IPU_ONLY = {
    "--vipu-partition": "text", "--vipu-server-host": "text", "--vipu-server-port": "int",
    "--vipu-server-timeout": "int", "--vipu-cluster": "text", "--vipu-allocation": "text",
    "--update-partition": "bool", "--reset-partition": "bool", "--remove-partition": "bool",
    "--numa-aware": "bool", "--num-ilds": "int", "--executable-cache-path": "text",
    "--offline-mode": "bool", "--ipus-per-replica": "int",
}
# What this poprun does with them: (attribute, kind).
_USED = {
    "--num-instances": ("num_instances", "int"),
    "--num-replicas": ("num_replicas", "int"),
    "--host": ("hosts", "hosts"),
    "-H": ("hosts", "hosts"),
    "--mpi-global-args": ("mpi_global_args", "mpi"),
    "--mpi-local-args": ("mpi_local_args", "mpi"),
    "--instance-mpi-local-args": ("instance_mpi_local_args", "instance"),
    "--only-output-from-instance": ("only_output_from_instance", "int"),
    "--print-topology": ("print_topology", "bool"),
}
_USAGE = """usage: ringflow-poprun [options] program [args]

A CPU stand-in for Graphcore's poprun: runs the instances with Open MPI's mpirun.
  --num-instances=N              instances (default 1), divided evenly among the hosts
  --num-replicas=R               replicas (default: one per instance), divided among them
  --ipus-per-replica=K           exported as POPDIST_NUM_IPUS_PER_REPLICA (default 1)
  -H, --host=H1,H2,...           hosts (default localhost); instances in contiguous blocks
  --mpi-global-args="ARGS"       options for mpirun
  --mpi-local-args="ARGS"        mpirun options for every instance (-x NAME[=VALUE] ...)
  --instance-mpi-local-args=I:"ARGS"   mpirun options for instance I only
  --only-output-from-instance=I  show only instance I's output
  --print-topology=yes|no        print hosts, instances and replicas first
  -v, --verbose                  print the mpirun command
IPU-only flags ({flags}) are accepted and ignored.
"""


@dataclass(frozen=True)
class PopRunArgs:
    program: list[str]
    num_instances: int = 1
    num_replicas: int | None = None  # None: one per instance
    ipus_per_replica: int = 1
    hosts: tuple[str, ...] = ("localhost",)
    mpi_global_args: tuple[str, ...] = ()
    mpi_local_args: tuple[str, ...] = ()
    instance_mpi_local_args: dict[int, tuple[str, ...]] = field(default_factory=dict)
    only_output_from_instance: int | None = None
    print_topology: bool = False
    verbose: int = 0
    ignored: tuple[str, ...] = ()  # the IPU-only options as given

    @property
    def replicas(self) -> int:
        return self.num_instances if self.num_replicas is None else self.num_replicas

    @property
    def per_host(self) -> int:
        return self.num_instances // len(self.hosts)

    def host_of(self, instance: int) -> str:
        return self.hosts[instance // self.per_host]


def _int(flag: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{flag}={value!r}: expected a whole number") from None
    if number < 0:
        raise ConfigError(f"{flag}={value}: expected a number >= 0")
    return number


def _bool(flag: str, value: str) -> bool:
    word = value.strip().lower()
    if word not in BOOL_WORDS:
        raise ConfigError(f"{flag}={value!r}: expected yes or no")
    return word in _TRUE


def _hosts(flag: str, value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(","))
    for name in names:
        try:
            check_host(name)
        except ConfigError as exc:
            raise ConfigError(f"{flag}={value!r}: {exc}") from None
    if len(set(names)) != len(names):
        raise ConfigError(f"{flag}={value!r} names a host twice")
    return names


def _mpi(flag: str, value: str) -> tuple[str, ...]:
    try:
        options = tuple(shlex.split(value))
    except ValueError as exc:
        raise ConfigError(f"{flag}: cannot split {value!r} into mpirun options ({exc})") from None
    check_no_separator(options, flag)
    if options[-1:] == ("-x",):  # it would take the option mpirun gets after it
        raise ConfigError(f"{flag}={value!r} ends with -x and no variable")
    return options


def _instance(flag: str, value: str) -> tuple[int, tuple[str, ...]]:
    index, colon, text = value.partition(":")
    if not colon:
        raise ConfigError(f"{flag}={value!r}: expected INDEX:\"mpirun options\"")
    return _int(f"{flag} index", index.strip()), _mpi(flag, text)


_KINDS: dict[str, Callable[[str, str], object]] = {
    "int": _int, "bool": _bool, "hosts": _hosts, "mpi": _mpi, "instance": _instance,
    "text": lambda flag, value: value,
}


class HelpRequested(Exception):
    """-h/--help came: print `usage()` and exit 0."""


def usage() -> str:
    return _USAGE.format(flags=", ".join(sorted(IPU_ONLY)))


def parse_poprun_args(argv: Sequence[str]) -> PopRunArgs:
    """argv after the program name; ConfigError for anything poprun would refuse,
    HelpRequested for -h/--help."""
    values: dict[str, object] = {}
    first: dict[str, str] = {}  # attribute -> the flag that set it
    instance_args: dict[int, tuple[str, ...]] = {}
    ignored: list[str] = []
    verbose = 0
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            i += 1
            break
        if not token.startswith("-") or token == "-":
            break
        if token in ("-h", "--help"):
            raise HelpRequested
        if token in ("-v", "--verbose", "-vv"):
            verbose += 2 if token == "-vv" else 1
            i += 1
            continue
        flag, eq, value = token.partition("=")
        kind = _USED[flag][1] if flag in _USED else IPU_ONLY.get(flag)
        if kind is None:
            raise ConfigError(f"unknown option {flag!r} (see ringflow-poprun --help)")
        if not eq:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if kind == "bool" and (following is None or following.lower() not in BOOL_WORDS):
                value = "yes"  # a bare boolean flag switches it on
            elif following is None:
                raise ConfigError(f"option {flag} needs a value")
            else:
                value = following
                i += 1
        parsed = _KINDS[kind](flag, value)
        i += 1
        if flag in IPU_ONLY:
            ignored.append(f"{flag}={value}")
            if flag == "--ipus-per-replica":
                values["ipus_per_replica"] = parsed
            continue
        name = _USED[flag][0]
        if kind == "instance":
            index, options = parsed  # type: ignore[misc]
            if index in instance_args:
                raise ConfigError(f"{flag}: instance {index} is given twice")
            instance_args[index] = options
        elif name in first:  # poprun's own parser would keep the last: say so instead
            twice = flag if first[name] == flag else f"{first[name]}/{flag}"
            raise ConfigError(f"{twice} is given twice; give each option once (the last "
                              f"would replace the first)")
        else:
            values[name] = parsed
            first[name] = flag
    program = tokens[i:]
    if not program:
        raise ConfigError("no program to run: poprun [options] program [args]")
    check_no_separator(program, "the program and its arguments")
    args = PopRunArgs(program=program, instance_mpi_local_args=instance_args,
                      verbose=verbose, ignored=tuple(ignored), **values)  # type: ignore[arg-type]
    _check(args)
    return args


def _check(args: PopRunArgs) -> None:
    n, hosts = args.num_instances, len(args.hosts)
    if n < 1:
        raise ConfigError("--num-instances must be at least 1")
    if n % hosts:
        raise ConfigError(f"--num-instances={n} cannot be divided evenly among {hosts} hosts "
                          f"({','.join(args.hosts)})")
    if args.replicas < 1 or args.replicas % n:
        raise ConfigError(f"--num-replicas={args.replicas} must be a positive multiple of "
                          f"--num-instances={n} (the replicas are divided evenly among the "
                          f"instances)")
    if args.ipus_per_replica < 1:
        raise ConfigError("--ipus-per-replica must be at least 1")
    for index in args.instance_mpi_local_args:
        if index >= n:
            raise ConfigError(f"--instance-mpi-local-args names instance {index}, but there "
                              f"are {n} (0..{n - 1})")
    only = args.only_output_from_instance
    if only is not None and only >= n:
        raise ConfigError(f"--only-output-from-instance={only}: there are {n} instances")
