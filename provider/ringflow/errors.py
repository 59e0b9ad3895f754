"""The one exception hierarchy of ringflow (DESIGN.md section 7).

Messages say what was expected, what came, and where (op index and type, rank, host).
The Airflow provider re-raises these as ``AirflowException`` with the same message.
"""

from __future__ import annotations


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


class ConfigError(RingflowError):
    """A configuration (job spec, CLI arguments, strategy, environment) is invalid."""
