"""The one exception hierarchy of ringflow (DESIGN.md section 7).

Messages say what was expected, what came, and where (op index and type, rank, host).
The Airflow provider re-raises these as ``AirflowException`` with the same message.
"""

from __future__ import annotations

from collections.abc import Sequence


class RingflowError(Exception):
    """Base of every error ringflow raises on purpose."""


class ProgramError(RingflowError):
    """A program is malformed: unknown op, bad slot, undefined variable, shape mismatch."""


class ExecutionError(RingflowError):
    """Running a program failed: bad feed, missing input, a kernel raised, NaN/inf found."""


class CommError(RingflowError):
    """A collective failed: a peer died, a connection broke, a handshake was refused."""


class CommTimeoutError(CommError):
    """A collective or rendezvous wait passed its deadline."""


class LaunchError(RingflowError):
    """The launcher could not start the job or a worker failed."""


class HostUnreachableError(LaunchError):
    """A host could not be reached (SSH connect or login failed) or its link was lost."""


class FolderError(LaunchError):
    """A folder the job needs cannot be used on a host: not writable, a symlink, or not this
    user's. A retry cannot fix it; the message names the host, the folder and the cause."""


class ConfigError(RingflowError):
    """A configuration (job spec, CLI arguments, strategy, environment) is invalid."""


class ConfigTypeError(ConfigError, TypeError):
    """A ConfigError where Paddle raises TypeError (a value of the wrong type, an unknown
    strategy option), so ``except TypeError`` written for Paddle keeps working."""


class ConfigValueError(ConfigError, ValueError):
    """A ConfigError where Paddle raises ValueError (``a_sync`` not a bool,
    ``last_comm_group_size_MB <= 0``), so ``except ValueError`` keeps working."""


def gathered(what: str, problems: Sequence[LaunchError | str]) -> LaunchError:
    """One error for what failed on several hosts (`what failed: a; b`): a
    HostUnreachableError (or FolderError) when every host failed that way, else a
    LaunchError."""
    text = f"{what} failed: " + "; ".join(str(p) for p in problems)
    for kind in (HostUnreachableError, FolderError):
        if problems and all(isinstance(p, kind) for p in problems):
            return kind(text)
    return LaunchError(text)


def did_you_mean(name: object, known: Sequence[str]) -> str:
    """`` (did you mean 'steps'?)`` for a misspelt name (``stpes``), the nearest of `known`
    (difflib's ratio >= 0.6); "" when none is near. The job spec, model and optimizer
    arguments and the operators' own arguments all suggest names with it."""
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
