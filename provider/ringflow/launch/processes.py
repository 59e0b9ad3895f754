"""Process-group mechanics for the launcher on Linux: parent-death signal, subreaper,
signalling a worker's whole group, finding which groups still have live members, reaping.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

from ringflow.launch.exits import describe_exit, shell_exit_code

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


class Prctl:
    """prctl(2) through ctypes; every call is a no-op returning False off Linux."""

    def __init__(self) -> None:
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            self._prctl = self._libc.prctl
        except (OSError, AttributeError):
            self._prctl = None

    def _call(self, option: int, value: int) -> bool:
        if self._prctl is None:
            return False
        return self._prctl(option, value, 0, 0, 0) == 0

    def become_subreaper(self) -> bool:
        """Orphaned descendants are re-parented to us, not to init, so we can reap them
        (some container inits never do) and see escapees that left their group."""
        return self._call(PR_SET_CHILD_SUBREAPER, 1)

    def child_setup(self, parent_pid: int,
                    death_signal: int = signal.SIGKILL) -> Callable[[], None]:
        """A preexec_fn: the child gets `death_signal` when the thread that forked it dies.

        PDEATHSIG is bound to the forking thread, so the launcher forks from its main
        thread only, and before any other thread exists (preexec_fn is unsafe with threads).
        If the launcher died between fork and prctl the signal would never come: check.
        """
        prctl = self._prctl

        def setup() -> None:
            if prctl is not None:
                prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
            if os.getppid() != parent_pid:
                os._exit(128 + death_signal)

        return setup


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to every process of group `pgid`; False when the group is gone."""
    if pgid <= 1:  # never signal init's group or "every process" by mistake
        raise ValueError(f"refusing to signal process group {pgid}")
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member changed credentials; it is still there
    return True


def terminate_group(pgid: int) -> bool:
    """SIGTERM then SIGCONT: a stopped member (SIGSTOP, a debugger) would otherwise hold
    the SIGTERM pending until the grace runs out and SIGKILL comes."""
    if not signal_group(pgid, signal.SIGTERM):
        return False
    signal_group(pgid, signal.SIGCONT)
    return True


def _stat_fields(pid_dir: Path) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of one /proc entry; None if it vanished meanwhile."""
    try:
        text = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # comm is in parentheses and may itself contain ') ', so split at the last one
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def scan_processes() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgrp) of every process visible in /proc."""
    rows = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry)
            if fields is not None:
                rows.append((int(entry.name), *fields))
    return rows


def stopped_processes(pids: Iterable[int]) -> list[int]:
    """Those of `pids` that are stopped (state T or t: SIGSTOP, a debugger)."""
    stopped = []
    for pid in pids:
        fields = _stat_fields(PROC / str(pid))
        if fields is not None and fields[0] in "Tt":
            stopped.append(pid)
    return stopped


def live_groups(pgids: Iterable[int]) -> set[int]:
    """The groups among `pgids` with a member that is not a zombie.

    A zombie is dead but stays in its group until reaped, so killpg(pgid, 0) alone would
    report a group alive forever under an init that never reaps.
    """
    wanted = {g for g in pgids if signal_group(g, 0)}
    if not wanted or not PROC.is_dir():
        return wanted
    return {pgrp for _, state, _, pgrp in scan_processes()
            if pgrp in wanted and state not in ("Z", "X")}


def children_of(pid: int, exclude: Iterable[int] = (), zombies: bool = False) -> list[int]:
    """Direct children of `pid` (live ones, or only zombies), e.g. orphans re-parented to a
    subreaper."""
    skip = set(exclude)
    return [p for p, state, ppid, _ in scan_processes()
            if ppid == pid and p not in skip and (state in ("Z", "X")) == zombies]


def exit_status(pid: int) -> int | None:
    """A child's Popen-style return code (-N for signal N) once it exited, else None.

    The child is NOT reaped: while it is an unreaped zombie its pid, which is also its
    process group id, cannot be reused, so signalling that group never hits a stranger.
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def reap_orphans(exclude: Iterable[int]) -> None:
    """Reap zombie children that are not ours to reap later (`exclude`): descendants
    re-parented to us because we are a subreaper."""
    for pid in children_of(os.getpid(), exclude, zombies=True):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def describe_returncode(returncode: int) -> tuple[int, str]:
    """(shell-style exit code, human text): a signal death -N becomes 128+N
    (`ringflow.launch.exits` words it)."""
    return shell_exit_code(returncode), describe_exit(returncode)
