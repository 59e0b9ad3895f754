"""The mpirun command a PopRunArgs becomes, and the reassembly of mpirun's tagged output.

As Graphcore's poprun does (reference 6.2), the instances run under Open MPI's mpirun with
`--tag-output --bind-to none`: here one MPMD app context per instance, so each gets its own
`-x` exports (`--mpi-local-args`, then its `--instance-mpi-local-args`, then the POPDIST_*
variables) and runs on its host of a contiguous block (instance i on host i // per_host, as
Paddle's launcher assumes). MPI rank = instance index.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence

from ringflow.poprun.args import PopRunArgs

__all__ = ["EXIT_LINE", "RANK_EXIT_LINE", "OutputJoiner", "exported_names", "exported_values",
           "instance_env", "mpirun_argv"]

# Exported from poprun's own environment to every instance, as poprun does, when set.
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
JOB_VARS = ("RINGFLOW_JOB_ID", "RINGFLOW_JOB_TOKEN")
# Each instance runs under this POSIX sh, which reports its program's exit code and the time
# (the host's clock) on the instance's stderr: mpirun names the first exit IT sees, and an
# instance beside it that fails because a remote peer died is seen before that peer's exit
# crosses the network. A signal that ends the instance ends the sh too (mpirun signals the
# instance's process group): a stopped instance reports nothing.
EXIT_MARK = "ringflow-poprun-exit"
INSTANCE_SH = ('"$@"; code=$?; printf "%s %s %s\\n" ' + EXIT_MARK +
               ' "$code" "$(date +%s.%N)" >&2; exit "$code"')
EXIT_LINE = re.compile(rf"^{EXIT_MARK} (\d+) (\d+(?:\.\d+)?)$")
# A ringflow worker's own line, printed as it begins to exit, before its rings close (so
# before any peer can fail because of it): with RINGFLOW_REPORT_EXIT_TIME=1 in its env.
RANK_EXIT_LINE = re.compile(r"^ringflow-exit-time (\d+(?:\.\d+)?)( after-peer-failure)?$")


def exported_names(options: Sequence[str]) -> set[str]:
    """The variables that mpirun options export (`-x NAME` or `-x NAME=VALUE`)."""
    return {item.partition("=")[0] for flag, item in itertools.pairwise(options)
            if flag == "-x"}


def exported_values(options: Sequence[str]) -> dict[str, str]:
    """The variables that mpirun options define (`-x NAME=VALUE`), with their values."""
    return {name: value for flag, item in itertools.pairwise(options) if flag == "-x"
            for name, eq, value in [item.partition("=")] if eq}


def instance_env(args: PopRunArgs, instance: int, vipu: Mapping[str, str]) -> dict[str, str]:
    """The POPDIST_* (and IPUOF_VIPU_API_*) variables poprun exports to one instance.
    POPDIST_LOCAL_INSTANCE_INDEX is the instance's index on its host."""
    local = args.replicas // args.num_instances
    return {
        "POPDIST_NUM_TOTAL_REPLICAS": str(args.replicas),
        "POPDIST_NUM_IPUS_PER_REPLICA": str(args.ipus_per_replica),
        "POPDIST_NUM_LOCAL_REPLICAS": str(local),
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "POPDIST_REPLICA_INDEX_OFFSET": str(instance * local),
        "POPDIST_LOCAL_INSTANCE_INDEX": str(instance % args.per_host),
        **vipu,
    }


def vipu_env(ignored: Sequence[str]) -> dict[str, str]:
    """IPUOF_VIPU_API_* as poprun derives them from its V-IPU flags (with its defaults)."""
    given = dict(option.split("=", 1) for option in ignored)
    env = {"IPUOF_VIPU_API_PORT": given.get("--vipu-server-port", "8090"),
           "IPUOF_VIPU_API_TIMEOUT": given.get("--vipu-server-timeout", "120")}
    if "--vipu-server-host" in given:
        env["IPUOF_VIPU_API_HOST"] = given["--vipu-server-host"]
    if "--vipu-partition" in given:
        env["IPUOF_VIPU_API_PARTITION_ID"] = given["--vipu-partition"]
    return env


def mpirun_argv(args: PopRunArgs, environ: Mapping[str, str], mpirun: str = "mpirun",
                as_root: bool | None = None) -> list[str]:
    """mpirun's argv. Variables in `environ` named in PASS_THROUGH or JOB_VARS get a bare
    `-x NAME` (mpirun exports its own value: a token is never on the command line), unless
    the instance's options export them already."""
    if as_root is None:
        as_root = os.geteuid() == 0
    argv = [mpirun]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += ["--tag-output", "--bind-to", "none", *args.mpi_global_args]
    vipu = vipu_env(args.ignored)
    for instance in range(args.num_instances):
        options = [*args.mpi_local_args, *args.instance_mpi_local_args.get(instance, ())]
        taken = exported_names(options)
        own = {name: value for name, value in instance_env(args, instance, vipu).items()
               if name not in taken}
        bare = [name for name in (*PASS_THROUGH, *JOB_VARS)
                if name in environ and name not in taken]
        if instance:
            argv.append(":")
        argv += ["-np", "1", "-H", f"{args.host_of(instance)}:{args.per_host}", *options]
        for name in bare:
            argv += ["-x", name]
        for name, value in own.items():
            argv += ["-x", f"{name}={value}"]
        if "RINGFLOW_REPORT_EXIT_TIME" not in taken:
            argv += ["-x", "RINGFLOW_REPORT_EXIT_TIME=1"]
        argv += ["sh", "-c", INSTANCE_SH, "ringflow-poprun-instance", *args.program]
    return argv


# `[<job>,<rank>]<stdout>:` (or <stderr>, <stddiag>): Open MPI's --tag-output prefix.
_TAG = re.compile(rb"\[\d+,(\d+)\]<(std\w+)>:")


class OutputJoiner:
    """Whole lines out of one of mpirun's streams.

    Open MPI tags every piece an instance writes; a line written in two pieces arrives as two
    tagged fragments, with other instances' lines possibly between them. Every fragment but
    the last one of a line of mpirun's stream lacks its newline; so per mpirun line, each
    fragment is appended to its instance's pending text, and the last one completes it.
    Untagged lines are mpirun's own messages. `emit(instance or None, line)` gets each whole
    line (without its newline), decoded.
    """

    def __init__(self, emit: Callable[[int | None, str], None]) -> None:
        self._emit = emit
        self._rest = b""  # an incomplete line of mpirun's stream
        self._pending: dict[int, bytes] = {}

    def feed(self, data: bytes) -> None:
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            self._line(line)

    def close(self) -> None:
        """End of stream: what is pending is emitted as if its newline had come."""
        if self._rest:
            self._line(self._rest)
            self._rest = b""
        for instance in sorted(self._pending):
            self._emit(instance, self._decode(self._pending.pop(instance)))

    def _line(self, line: bytes) -> None:
        parts = _TAG.split(line)
        # parts: text before the first tag, then (rank, stream, text) per tag
        if parts[0] or len(parts) == 1:  # mpirun's own text (an empty line too)
            self._emit(None, self._decode(parts[0]))
        fragments = [(int(parts[i]), parts[i + 2]) for i in range(1, len(parts), 3)]
        for n, (instance, text) in enumerate(fragments):
            joined = self._pending.pop(instance, b"") + text
            if n == len(fragments) - 1:
                self._emit(instance, self._decode(joined))
            else:
                self._pending[instance] = joined

    @staticmethod
    def _decode(data: bytes) -> str:
        return data.decode("utf-8", "replace").rstrip("\r")
