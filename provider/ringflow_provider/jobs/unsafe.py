"""What a job's arguments may not carry unless the DAG author allows it: environment
variables that load code into every rank (`check_env`, both operators' ``extra_env`` and
``secret_env``; ``allow_unsafe_env``) and Open MPI 4 mpirun options that run commands, read
option or host files, or write files (`unsafe_mpirun_options`, PopRun's mpirun arguments;
``allow_unsafe_mpi_args``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["UNSAFE_ENV_RULE", "check_env", "check_mpirun_args", "unsafe_env_name",
           "unsafe_mca_param", "unsafe_mpirun_options"]

# Read by the dynamic loader, the interpreter, a non-interactive shell, or any exec*p.
_ENV_NAMES = frozenset({"PATH", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4",
                        "GCONV_PATH", "OPAL_PREFIX"})
_ENV_PREFIXES = ("LD_", "PYTHON", "BASH_FUNC_")
# Open MPI (and its PMIx) read MCA parameters from the environment too.
_MCA_ENV_PREFIXES = ("OMPI_MCA_", "PMIX_MCA_", "PRTE_MCA_", "OPAL_MCA_")
UNSAFE_ENV_RULE = "LD_*, PYTHON*, BASH_ENV, ENV, PATH, BASH_FUNC_*, ... and OMPI_MCA_* of an "\
                  "agent/launch/rsh/output/file parameter"

# mpirun options (Open MPI 4, `mpirun --help all`; leading dashes dropped) that start other
# commands (launch agents, debuggers, appfiles), read files of options or hosts, or write
# files; -s is --preload-binary's short form, -rf --rankfile's, -wd --wdir's.
_MPIRUN_FLAGS = frozenset({
    "launch-agent", "prefix", "path", "preload-files", "preload-binary", "s",
    "output-filename", "report-uri", "report-pid", "xml-file", "debug-daemons-file",
    "tmpdir", "app", "am", "tune", "hostfile", "machinefile", "default-hostfile", "rankfile",
    "rf", "hnp", "ompi-server", "debugger", "debug", "tv", "xterm", "dvm", "wd", "wdir",
})
_MCA_FLAGS = frozenset({"mca", "gmca"})  # -mca NAME VALUE
# Parts of an MCA parameter's name (split at '_') that make it choose a program to run
# (plm_rsh_agent, orte_launch_agent, orte_fork_agent, plm_rsh_args), a file to read or write
# (orte_output_filename, mca_base_param_files, orte_tmpdir_base) or a place to load from.
_MCA_PARTS = frozenset({"agent", "launch", "rsh", "ssh", "output", "prefix", "path", "report",
                        "debugger", "xterm", "exec", "preload", "hnp", "uri", "fork", "cmd",
                        "command", "tmpdir", "dir"})
_MCA_PART_ENDS = ("file", "files", "dir", "path", "agent")


def unsafe_mca_param(name: str) -> bool:
    """An MCA parameter that runs a command or reads or writes a file of its value."""
    parts = name.lower().split("_")
    return any(p in _MCA_PARTS or p.endswith(_MCA_PART_ENDS) for p in parts)


def unsafe_env_name(name: str) -> bool:
    if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES):
        return True
    prefix = next((p for p in _MCA_ENV_PREFIXES if name.startswith(p)), None)
    return prefix is not None and unsafe_mca_param(name[len(prefix):])


def check_env(env: Mapping[str, str] | None, field: str, allow: bool) -> None:
    """ValueError naming `field` and the variables that load code into every rank, unless
    `allow` (the operator's ``allow_unsafe_env``)."""
    if allow or not env:
        return
    bad = sorted(name for name in env if unsafe_env_name(name))
    if bad:
        raise ValueError(
            f"{field}: {', '.join(bad)} would load code into every rank (refused: "
            f"{UNSAFE_ENV_RULE}); pass allow_unsafe_env=True to the operator to set "
            f"{'it' if len(bad) == 1 else 'them'} anyway")


def unsafe_mpirun_options(tokens: Sequence[str]) -> list[str]:
    """The options among mpirun's `tokens` that run commands, read option or host files, or
    write files (`-mca` of such a parameter, `-x` of a variable `check_env` refuses), each
    as given (``--mca plm_rsh_agent``)."""
    found = []
    for i, flag in enumerate(tokens):
        if not flag.startswith("-"):
            continue
        name = flag.lstrip("-")
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if name in _MPIRUN_FLAGS:
            found.append(flag)
        elif name in _MCA_FLAGS and unsafe_mca_param(following):
            found.append(f"{flag} {following}")
        elif name == "x" and unsafe_env_name(following.partition("=")[0]):
            found.append(f"{flag} {following.partition('=')[0]}")
    return found


def _words(token: str) -> list[str]:
    """A token as an option parser reads it: its shell words, ``--flag=value`` as the flag
    and the words of its value (``--mpi-global-args=--mca plm_rsh_agent x``,
    ``--instance-mpi-local-args=0:-x LD_PRELOAD=y``)."""
    try:
        words = shlex.split(token)
    except ValueError:  # an unbalanced quote: its words as they stand
        words = token.split()
    out = []
    for word in words:
        flag, eq, value = word.partition("=")
        if word.startswith("-") and eq:  # and I:ARGS of --instance-mpi-local-args
            out.extend([flag, *_words(re.sub(r"^\d+:", "", value))])
        else:
            out.append(word)
    return out


def check_mpirun_args(tokens: Iterable[str], field: str, allow: bool) -> None:
    """ValueError naming `field` and each unsafe mpirun option in `tokens` (items that may
    hold several whitespace-separated options, as poprun's option values do), unless
    `allow` (the operator's ``allow_unsafe_mpi_args``)."""
    if allow:
        return
    bad = unsafe_mpirun_options([word for token in tokens for word in _words(token)])
    if bad:
        raise ValueError(
            f"{field}: {', '.join(repr(b) for b in bad)}: mpirun options that run commands, "
            f"read option or host files, or write files are refused; pass "
            f"allow_unsafe_mpi_args=True to the operator to use "
            f"{'it' if len(bad) == 1 else 'them'} anyway")
