"""How a process ended, in words, and which of several failures came first: the one wording
and the one rule that the launcher agent, the mpirun job, ringflow-poprun and the provider
report with; and the one table of the exit codes ringflow's own processes end with.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = ["CLOCK_SKEW_VAR", "EXIT_CHECKPOINT", "EXIT_CODES", "EXIT_CONFIG", "EXIT_ERROR",
           "EXIT_NONFINITE", "EXIT_OK", "FOLDER_REFUSED_EXIT", "LOST_EXIT", "NOT_RETRIED",
           "RUNNING_EXIT", "SETUP_EXIT", "STDIN_CLOSED_EXIT", "describe_exit",
           "describe_signal", "failure_order", "host_time", "shell_exit_code", "signal_name"]

# A rank of a training job (`python -m ringflow.train`), and the launcher agent after it
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_NONFINITE = 3
EXIT_CHECKPOINT = 4
# A host command of the provider's launchers, the launcher agent, the supervisor's `follow`
FOLDER_REFUSED_EXIT = 96
SETUP_EXIT = 97
RUNNING_EXIT = 98
STDIN_CLOSED_EXIT = 128 + signal.SIGHUP
LOST_EXIT = 255

#: every exit code ringflow's own processes choose, and what it means (above 128 a shell's
#: code for a signal: `describe_exit`)
EXIT_CODES = {
    EXIT_OK: "trained (or nothing was left to train)",
    EXIT_ERROR: "another ringflow error (a peer died, a collective timed out, ...)",
    EXIT_CONFIG: "the job spec or checkpoint was refused",
    EXIT_NONFINITE: "the loss became NaN or inf",
    EXIT_CHECKPOINT: "a checkpoint could not be written (permission, disk full); the "
                     "previous checkpoint is intact",
    FOLDER_REFUSED_EXIT: "a job folder or state folder is a symlink or another user's",
    SETUP_EXIT: "a host command could not set up (no home, a folder, the secrets file)",
    RUNNING_EXIT: "a job of this task try still runs",
    STDIN_CLOSED_EXIT: "the launcher agent stopped its ranks: the side that started it hung "
                       "up (its stdin ended)",
    LOST_EXIT: "the job's supervisor vanished without saying how the job ended",
}
#: a rank's exit codes that a retry of the task cannot fix
NOT_RETRIED = (EXIT_CONFIG, EXIT_NONFINITE, EXIT_CHECKPOINT)

_MAX_SIGNAL = 64  # Linux's last real-time signal; a shell's 128+N is a signal only up to it


def signal_name(number: int) -> str:
    """`SIGKILL`, or `signal 40` for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_signal(number: int) -> str:
    """`signal 9 (SIGKILL)`, or `signal 40` for a number without a name."""
    name = signal_name(number)
    return name if name.startswith("signal ") else f"signal {number} ({name})"


def shell_exit_code(returncode: int) -> int:
    """A Popen-style return code (-N for signal N) as a shell reports it (128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(code: int) -> str:
    """An exit status as a person reads it.

    A shell-style code: `exit code 1`; above 128 a shell (and mpirun, and the launcher) says
    a signal ended the process: `exit code 137 (128+9: SIGKILL)`. A Popen-style -N means the
    process was seen to die by signal N: `killed by SIGKILL (exit code 137)`.
    """
    if code < 0:
        return f"killed by {signal_name(-code)} (exit code {shell_exit_code(code)})"
    if 128 < code <= 128 + _MAX_SIGNAL:
        return f"exit code {code} (128+{code - 128}: {signal_name(code - 128)})"
    return f"exit code {code}"


# TEST ONLY: seconds added to every time a host's ringflow processes report (the exit times,
# the agents' observations, the clock sample the provider takes): the fault tests' hosts
# share one kernel clock, and this is how they give one of them a skewed clock
CLOCK_SKEW_VAR = "RINGFLOW_TEST_CLOCK_SKEW_S"

T = TypeVar("T")


def host_time() -> float:
    """This host's time.time(), as the times its ringflow processes report are taken (with
    the test-only skew of CLOCK_SKEW_VAR)."""
    try:
        skew = float(os.environ.get(CLOCK_SKEW_VAR) or 0.0)
    except ValueError:
        skew = 0.0
    return time.time() + skew


def failure_order(after_peer_failure: bool, began_exit_at: float | None,
                  index: int) -> tuple[bool, float, int]:
    """The sort key that puts the root cause of a failed job first.

    A failure that reported seeing a peer fail before it did is a consequence, so it comes
    after every other. Then by when each began to exit by its host's clock (a ringflow
    worker reports that before it closes its rings, so before a peer can fail because of
    it; else the time its exit was seen; unknown comes last), not by the order the exits
    were heard of. Then by index (rank, instance or host), so the order is total.
    """
    return (after_peer_failure, float("inf") if began_exit_at is None else began_exit_at,
            index)


def end_of_blame(first: T, failed_by_rank: Mapping[int, T],
                 blame: Callable[[T], int | None]) -> T:
    """The failure `first` led back along who blamed whom: a failure that saw a peer fail
    first (`blame` gives that peer's rank, None if it failed on its own) is a consequence of
    that peer's failure where the peer is among `failed_by_rank`, whatever their clocks say
    (a rank that notices a silent host wakes its ring by closing it, and the neighbour that
    then sees the close can begin to exit first). Ends at a failure on its own, one that
    blamed a rank not among them (another host's), or a cycle."""
    seen = set()
    current = first
    while (peer := blame(current)) is not None and peer in failed_by_rank and peer not in seen:
        seen.add(peer)
        current = failed_by_rank[peer]
    return current
