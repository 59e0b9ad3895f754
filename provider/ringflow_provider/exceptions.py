"""The exceptions a ringflow task fails with: one hierarchy under Airflow's `AirflowException`,
so a DAG's callbacks (``context["exception"]``) can tell why a task failed. Where a retry
cannot help (arguments refused, a job that refused its spec or diverged) the class is also
an `AirflowFailException`, which Airflow fails at once, without retries.

    RingflowException(AirflowException)
    +-- RingflowConfigException(+AirflowFailException)  an argument or the setup is refused
    |   +-- RingflowHostNotAllowedException     a host outside its connection's allowed_hosts
    |   +-- RingflowFolderException             a folder of the job is unusable on a host
    +-- RingflowLaunchException                 the job could not be started or watched
    |   +-- RingflowHostUnreachableException    a host could not be reached (or was lost)
    +-- RingflowJobFailedException              the job ran and failed (exit_code, host)
    |   +-- RingflowJobRefusedException(+AirflowFailException)  and a retry cannot fix it
    +-- RingflowJobKilledException              on_kill stopped it (mark failed, timeout)
    +-- RingflowMetricGateException(+AirflowFailException)  a model missed its fail_if gate
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.errors import FolderError, HostUnreachableError, LaunchError
from ringflow_provider.hooks.allowed_hosts import HostNotAllowedError


class RingflowException(AirflowException):
    """Base of every exception a ringflow task fails with on purpose."""


class RingflowConfigException(RingflowException, AirflowFailException):
    """An argument (as rendered) or the deployment is refused; not retried."""


class RingflowHostNotAllowedException(RingflowConfigException):
    """A host of the job is not among the ``allowed_hosts`` extra of the ssh connection that
    would reach it; refused before any SSH connection is opened, not retried."""


class RingflowFolderException(RingflowConfigException):
    """A folder of the job (log_dir, checkpoint_dir, its job folder) cannot be used on a
    host: not writable, a symlink, or another user's; not retried."""


class RingflowLaunchException(RingflowException):
    """The job could not be started or watched: a host command, a file, the runtime."""


class RingflowHostUnreachableException(RingflowLaunchException):
    """A host could not be reached over SSH, or stopped answering while the job ran."""


class RingflowJobFailedException(RingflowException):
    """The job ran and failed: a rank, an agent or PopRun ended with a non-zero exit code.

    :ivar exit_code: the failing process's exit code (None when none came)
    :ivar host: the host it ran on (None: the worker's own host)
    """

    def __init__(self, message: str, exit_code: int | None = None,
                 host: str | None = None) -> None:
        super().__init__(message)
        self.exit_code, self.host = exit_code, host


class RingflowMetricGateException(RingflowException, AirflowFailException):
    """A model's metric missed the threshold its TPEvaluateOperator's ``fail_if`` sets; not
    retried (the same checkpoint gives the same metric)."""


class RingflowJobRefusedException(RingflowJobFailedException, AirflowFailException):
    """The job failed in a way a retry cannot fix (its spec or checkpoint was refused, the
    loss became NaN or inf); not retried."""


class RingflowJobKilledException(RingflowException):
    """The job was stopped because Airflow killed the task (on_kill)."""


def launch_exception(exc: LaunchError, message: str
                     ) -> RingflowLaunchException | RingflowConfigException:
    """The task's exception for a launcher error (`message`: its text, masked)."""
    if isinstance(exc, HostNotAllowedError):
        return RingflowHostNotAllowedException(message)
    if isinstance(exc, FolderError):
        return RingflowFolderException(message)
    if isinstance(exc, HostUnreachableError):
        return RingflowHostUnreachableException(message)
    return RingflowLaunchException(message)
