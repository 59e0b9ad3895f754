"""Everything ringflow knows about Open MPI: the mpirun command of a job (base options, one
MPMD app context per process with its `-x` exports and the sh that reports its exit), `-x`
options read back, mpirun's tagged output joined into whole lines, and the report lines and
what mpirun's own say (the first failure, a daemon it lost).

As Graphcore's poprun does (reference 6.2), processes run under mpirun with `--tag-output
--bind-to none`; here one app context per process (`-np 1 -H host:slots`), so each gets its
own exports and host. MPI rank = index of the app context.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ringflow.errors import ConfigError
from ringflow.launch.env import JOB_ID_VAR, JOB_TOKEN_VAR
from ringflow.launch.exits import SETUP_EXIT, failure_order
from ringflow.launch.lines import MAX_LINE_BYTES, Line, LinePieces
from ringflow.launch.secret_drop import SECRETS_DIR_VAR

__all__ = ["EXIT_LINE", "EXIT_NONCE_VAR", "INSTANCE_SH", "RANK_EXIT_LINE", "AppContext",
           "ExitReports", "FailureReport", "MpirunPlan", "OutputJoiner", "base_argv",
           "check_no_separator", "context_argv", "exported_names", "exported_values",
           "failure_report", "lost_daemon_node", "mpirun_argv", "one_per_host_argv"]

# Exported from the job's own environment to every process, as poprun does, when set; the
# job's id too (a bare `-x NAME`: mpirun exports its own value). The job's token and the
# plan's secrets are no `-x` once a secrets folder is given: Open MPI would carry their
# values to its daemons in clear; the hosts get them over SSH (`secret_drop`).
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
JOB_VARS = (JOB_ID_VAR, JOB_TOKEN_VAR)
REPORT_EXIT_VAR = "RINGFLOW_REPORT_EXIT_TIME"
# Each process runs under this POSIX sh, which reports its program's exit code and the time
# (the host's clock) on the process's stderr: mpirun names the first exit IT sees, and a
# process beside it that fails because a remote peer died is seen before that peer's exit
# crosses the network. A signal that ends the process ends the sh too (mpirun signals the
# process group): a stopped process reports nothing. (The names are ringflow-poprun's,
# where this began; command lines stay as they were.)
EXIT_MARK = "ringflow-poprun-exit"
INSTANCE_NAME = "ringflow-poprun-instance"  # the sh's $0
# With RINGFLOW_SECRETS_DIR set, the sh first sources this process's secrets file there (one
# per MPI rank, delivered over SSH: `secret_drop`) and removes it.
SECRETS_SH = ('if [ -n "$RINGFLOW_SECRETS_DIR" ]; then '
              'f="$RINGFLOW_SECRETS_DIR/$OMPI_COMM_WORLD_RANK"; '
              'if [ ! -r "$f" ]; then echo "ringflow: no secrets file $f on $(hostname)" >&2; '
              f'exit {SETUP_EXIT}; fi; . "$f"; rm -f "$f"; unset f; fi; '
              'unset RINGFLOW_SECRETS_DIR; ')
# The report carries the job's exit nonce (delivered with the secrets, taken out of the
# environment before the program starts): a program printing a report line of its own cannot
# know it, so cannot name its exit code or time.
EXIT_NONCE_VAR = "RINGFLOW_EXIT_NONCE"
INSTANCE_SH = (SECRETS_SH + f'n="${{{EXIT_NONCE_VAR}:-}}"; unset {EXIT_NONCE_VAR}; '
               '"$@"; code=$?; printf "%s %s %s %s\\n" ' + EXIT_MARK +
               ' "$n" "$code" "$(date +%s.%N)" >&2; exit "$code"')
EXIT_LINE = re.compile(rf"^{EXIT_MARK} (\S+) (\d+) (\d+(?:\.\d+)?)\Z")
# A ringflow worker's own line, printed as it begins to exit, before its rings close (so
# before any peer can fail because of it): with RINGFLOW_REPORT_EXIT_TIME=1 in its env.
RANK_EXIT_LINE = re.compile(r"^ringflow-exit-time (\d+(?:\.\d+)?)( after-peer-failure(?: \d+)?)?\Z")
# mpirun's own report of the first failure (Open MPI 4 and 5).
FAILED_RANK = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
FAILED_CODE = re.compile(r"Exit code:\s*(-?\d+)")
SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal "
                       r"(\d+)(?: \(([^)]*)\))?")
# mpirun's report of a daemon it lost ("ORTE has lost communication with a remote daemon";
# Open MPI 5: "PRTE has lost ..."): the daemon's node, as mpirun was given it
LOST_DAEMON = re.compile(r"^\s*Remote daemon\s*:\s*\[\[\d+,\d+\],\d+\] on node (\S+)\s*\Z")
# ... or its rsh agent's (OpenSSH's) word that the session of a host's daemon was closed from
# that side (mpirun then says only that it was "unable to reliably start one or more daemons")
DAEMON_SSH_CLOSED = re.compile(r"^Connection to (\S+) closed by remote host\.\s*\Z")
# `[<job>,<rank>]<stdout>:` (or <stderr>, <stddiag>): Open MPI's --tag-output prefix.
TAG = re.compile(rb"\[\d+,(\d+)\]<(std\w+)>:")
TAGGED_LINE = re.compile(r"\[\d+,(\d+)\]<(std\w+)>:(.*)")


@dataclass(frozen=True)
class AppContext:
    """One process of the job: where it runs, what it is told, what it runs.

    `options` are mpirun options as given for it (`-x NAME[=VALUE]` and any other), placed
    first; `env` is exported as `-x NAME=VALUE` unless `options` export NAME already.
    """

    host: str
    argv: tuple[str, ...]
    slots: int = 1  # the host's slots, as `-H host:slots` says to mpirun
    options: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MpirunPlan:
    """One mpirun job: a process per app context (MPI rank = index), mpirun's own options,
    the job's id when its command line names one (`-x RINGFLOW_JOB_ID=...`), and which
    variables are secret."""

    contexts: tuple[AppContext, ...]
    global_args: tuple[str, ...] = ()
    job_id: str | None = None
    #: variables whose values are secret: never a `-x` (delivered over SSH, `secret_drop`)
    secrets: tuple[str, ...] = ()

    def ranks_by_host(self) -> dict[str, list[int]]:
        ranks: dict[str, list[int]] = {}
        for index, ctx in enumerate(self.contexts):
            ranks.setdefault(ctx.host, []).append(index)
        return ranks

    @property
    def hosts(self) -> tuple[str, ...]:
        """The job's hosts, each once, in the order of its processes."""
        return tuple(dict.fromkeys(ctx.host for ctx in self.contexts))

    def host_of(self, index: int) -> str:
        return self.contexts[index].host


def exported_names(options: Sequence[str]) -> set[str]:
    """The variables that mpirun options export (`-x NAME` or `-x NAME=VALUE`)."""
    return {item.partition("=")[0] for flag, item in itertools.pairwise(options)
            if flag == "-x"}


def exported_values(options: Sequence[str]) -> dict[str, str]:
    """The variables that mpirun options define (`-x NAME=VALUE`), with their values."""
    return {name: value for flag, item in itertools.pairwise(options) if flag == "-x"
            for name, eq, value in [item.partition("=")] if eq}


def check_no_separator(tokens: Sequence[str], what: str) -> None:
    """mpirun reads a `:` token anywhere on its command line as the start of another app
    context (another program it runs): none may come from a program's arguments or from
    options given to mpirun."""
    if ":" in tokens:
        raise ConfigError(f"{what}: a ':' token would make Open MPI's mpirun start another "
                          f"program; pass it inside a token (e.g. --opt=:)")


def base_argv(mpirun: str, global_args: Sequence[str], as_root: bool | None = None) -> list[str]:
    """mpirun and its options for the whole job (root must say it means it)."""
    check_no_separator(global_args, "mpirun's global options")
    if as_root is None:
        as_root = os.geteuid() == 0
    return [mpirun, *(["--allow-run-as-root"] if as_root else []), "--tag-output",
            "--bind-to", "none", *global_args]


def without_exports(options: Sequence[str], names: Collection[str]) -> list[str]:
    """mpirun options with every bare `-x NAME` of `names` taken out."""
    out: list[str] = []
    skip = False
    for index, item in enumerate(options):
        if skip:
            skip = False
            continue
        if item == "-x" and index + 1 < len(options) and options[index + 1] in names:
            skip = True
            continue
        out.append(item)
    return out


def context_argv(ctx: AppContext, environ: Mapping[str, str], secrets: Collection[str] = (),
                 secrets_dir: str | None = None) -> list[str]:
    """One app context: its host, its options, the variables of `environ` named in
    PASS_THROUGH or JOB_VARS (bare), its env, the exit-time report, the sh around argv.
    With `secrets_dir` the `secrets` (and the job token) are no `-x`: the sh reads them
    from its file there."""
    check_no_separator(ctx.options, f"the mpirun options of the process on {ctx.host}")
    check_no_separator(ctx.argv, f"the program of the process on {ctx.host}")
    hidden = {*secrets, JOB_TOKEN_VAR} if secrets_dir else set()
    options = without_exports(ctx.options, hidden)
    taken = exported_names(options)
    argv = ["-np", "1", "-H", f"{ctx.host}:{ctx.slots}", *options]
    for name in (*PASS_THROUGH, *JOB_VARS):
        if name in environ and name not in taken and name not in hidden:
            argv += ["-x", name]
    if secrets_dir:
        argv += ["-x", f"{SECRETS_DIR_VAR}={secrets_dir}"]
    for name, value in ctx.env.items():
        if name not in taken:
            argv += ["-x", f"{name}={value}"]
    if REPORT_EXIT_VAR not in taken:
        argv += ["-x", f"{REPORT_EXIT_VAR}=1"]
    return [*argv, "sh", "-c", INSTANCE_SH, INSTANCE_NAME, *ctx.argv]


def mpirun_argv(plan: MpirunPlan, environ: Mapping[str, str], mpirun: str = "mpirun",
                as_root: bool | None = None, secrets_dir: str | None = None) -> list[str]:
    """mpirun's argv: the base, then the app contexts separated by `:` (MPMD); with
    `secrets_dir`, the plan's secrets and the token come from files there, not from `-x`."""
    argv = base_argv(mpirun, plan.global_args, as_root)
    for index, ctx in enumerate(plan.contexts):
        argv += [":"] if index else []
        argv += context_argv(ctx, environ, plan.secrets, secrets_dir)
    return argv


def one_per_host_argv(mpirun: str, hosts: Sequence[str], global_args: Sequence[str],
                      environ: Mapping[str, str], argv: Sequence[str],
                      as_root: bool | None = None) -> list[str]:
    """mpirun's argv that runs `argv` once on each host (with PATH and PYTHONPATH)."""
    check_no_separator(argv, "the program mpirun runs on each host")
    return [*base_argv(mpirun, global_args, as_root), "-np", str(len(hosts)),
            "-H", ",".join(f"{host}:1" for host in hosts), "--map-by", "node",
            *(part for name in ("PATH", "PYTHONPATH") if name in environ
              for part in ("-x", name)), *argv]


class ExitReports:
    """What the job's processes (by index) said of their exits, in lines for machines: an
    instance sh's report of its exit code and time (EXIT_LINE, with the job's nonce), a
    ringflow worker's of when it began to exit and whether it saw a peer fail first
    (RANK_EXIT_LINE)."""

    def __init__(self, nonce: str) -> None:
        self._nonce = nonce
        self.exits: list[tuple[float, int, int]] = []  # (time, index, exit code)
        self.began_exit: dict[int, float] = {}
        self.after_peer_failure: set[int] = set()  # processes that reported seeing one

    def take(self, index: int, line: str) -> bool:
        """Record a line that reports an exit (for us, not for people); False if not one."""
        reported = EXIT_LINE.match(line)
        if reported and reported.group(1) == self._nonce:  # its sh: exit code and time
            self.exits.append((float(reported.group(3)), index, int(reported.group(2))))
            return True
        began = RANK_EXIT_LINE.match(line)
        if began:  # a ringflow worker about to close its rings
            self.began_exit.setdefault(index, float(began.group(1)))
            if began.group(2):
                self.after_peer_failure.add(index)
            return True
        return False

    def any_failed(self) -> bool:
        return any(code != 0 for _, _, code in self.exits)

    def unreported(self, count: int) -> list[int]:
        """The processes (by index, of `count`) that sent no exit report."""
        reported = {index for _, index, _ in self.exits}
        return [i for i in range(count) if i not in reported]

    def first_failed(self) -> tuple[int, int] | None:
        """(index, exit code) of the process that failed first, by `failure_order` on the
        hosts' clocks: when a ringflow worker began to exit (before its peers could notice),
        else when the process's sh saw it end. None when no failure was reported."""
        failed = sorted((failure_order(i in self.after_peer_failure,
                                       min(t, self.began_exit.get(i, t)), i), c)
                        for t, i, c in self.exits if c != 0)
        if not failed:
            return None
        (_, _, index), exit_code = failed[0]
        return index, exit_code


@dataclass(frozen=True)
class FailureReport:
    """mpirun's own report of the first failure: the process (MPI rank) and its exit code,
    or, where a signal ended it, its node and the signal."""

    index: int
    exit_code: int | None = None
    node: str | None = None
    signal: int | None = None


def failure_report(said: str) -> FailureReport | None:
    """What mpirun's own lines (`said`, joined) report of the first failure, if anything."""
    rank, exit_code = FAILED_RANK.search(said), FAILED_CODE.search(said)
    if rank and exit_code:
        return FailureReport(int(rank.group(1)), exit_code=int(exit_code.group(1)))
    signalled = SIGNALLED.search(said)
    if signalled:
        return FailureReport(int(signalled.group(1)), node=signalled.group(2),
                             signal=int(signalled.group(3)))
    return None


def lost_daemon_node(line: str) -> str | None:
    """The node whose Open MPI daemon mpirun lost, as one of mpirun's own lines says it (its
    report, or OpenSSH's word that the daemon's session was closed); None for any other."""
    lost = LOST_DAEMON.match(line) or DAEMON_SSH_CLOSED.match(line)
    return lost.group(1) if lost else None


# Any next tag or end of one of mpirun's lines; and the start of a tag a read cut off.
_NEXT = re.compile(rb"\n|" + TAG.pattern)
_TAG_START = re.compile(rb"\[\d*(?:,\d*(?:\](?:<\w*>?)?)?)?\Z")
_TAG_MAX = 64


class _ProcessLines(LinePieces):
    """The lines of one process (or of mpirun itself) in mpirun's stream, each a `Line`."""

    def __init__(self, emit: Callable[[Line], None], max_line: int) -> None:
        super().__init__(max_line)
        self._emit_line = emit

    def piece(self, data: bytes, ending: bytes, start: bool) -> None:
        self._emit_line(Line(data.decode("utf-8", "replace"), self.is_whole(ending, start)))


class OutputJoiner:
    """Whole lines out of one of mpirun's streams, in bounded memory.

    Open MPI tags every piece a process writes (at its start, and after each `\\n` in it);
    a line written in two pieces arrives as two tagged fragments, with other processes'
    lines possibly between them. So text after a tag, up to the next tag or mpirun's next
    `\\n`, is that process's; text before a line's first tag is mpirun's own. Each one's
    text goes through its own `LinePieces` (`ringflow.launch.lines`: a line ends at `\\n`,
    `\\r\\n` or a lone `\\r`, one longer than `max_line` comes in pieces). `emit(index or
    None, line)` gets each line as a `Line`, decoded, without its ending.

    Open MPI does not escape a tag that a process prints itself, and a process's line often
    comes in two fragments (Open MPI 4.1 may tag its newline apart) with another process's
    between them, so a tag in mid-line cannot be told from a printed one. What is read from
    these lines for machines is safe all the same: a ringflow agent writes no tag its ranks
    printed (`ringflow.launch.logs.untag`), and an instance's exit report carries the job's
    nonce (EXIT_NONCE_VAR).
    """

    def __init__(self, emit: Callable[[int | None, str], None],
                 max_line: int = MAX_LINE_BYTES) -> None:
        self._emit = emit
        self._max = max_line
        self._lines: dict[int | None, _ProcessLines] = {}
        self._owner: int | None = None  # whose text mpirun's stream carries now
        self._held = b""  # the start of a tag that the end of a read cut off
        self._open = False  # bytes came since mpirun's last `\\n`

    def feed(self, data: bytes) -> None:
        data = self._held + data
        cut = self._hold_from(data)
        data, self._held = data[:cut], data[cut:]
        pos = 0
        for match in _NEXT.finditer(data):
            self._text(data[pos:match.start()])
            if match.group(1) is None:
                self._end_line()
            else:
                self._tag(int(match.group(1)))
            pos = match.end()
        self._text(data[pos:])

    def close(self) -> None:
        """End of stream: what is pending is emitted (a line without its newline: no whole
        line)."""
        self._text(self._held)
        self._held = b""
        self._owner, self._open = None, False
        for owner in sorted(self._lines, key=lambda index: -1 if index is None else index):
            self._lines[owner].flush()

    @property
    def held_bytes(self) -> int:
        """Bytes held for lines not yet ended (what bounds the joiner's memory)."""
        return len(self._held) + sum(lines.pending_bytes for lines in self._lines.values())

    @staticmethod
    def _hold_from(data: bytes) -> int:
        start = data.rfind(b"[", max(0, len(data) - _TAG_MAX))
        return start if start >= 0 and _TAG_START.match(data, start) else len(data)

    def _text(self, text: bytes) -> None:
        if text:
            self._open = True
            self._of(self._owner).feed(text)

    def _tag(self, index: int) -> None:
        self._open = True
        if self._owner is None:  # mpirun's text before the tag is a line of its own
            self._of(None).flush()
        self._owner = index

    def _end_line(self) -> None:
        self._of(self._owner).feed(b"\n")
        self._owner, self._open = None, False

    def _of(self, owner: int | None) -> _ProcessLines:
        lines = self._lines.get(owner)
        if lines is None:
            def emit(line: Line) -> None:
                self._emit(owner, line)
            lines = self._lines[owner] = _ProcessLines(emit, self._max)
        return lines
