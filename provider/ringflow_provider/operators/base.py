"""What both operators share: a job started through a launcher (or an earlier try's job that
still runs, attached to again), watched attached in the task or deferred to the triggerer,
and reported by one code path whichever way it was watched; `on_kill` stops it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import TaskDeferred

from ringflow.errors import LaunchError, did_you_mean
from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowHostNotAllowedException,
    RingflowHostUnreachableException,
    RingflowJobKilledException,
    launch_exception,
)
from ringflow_provider.jobs.masking import Secrets
from ringflow_provider.launchers import launcher_for
from ringflow_provider.launchers.base import Launcher
from ringflow_provider.launchers.job import ON_EXISTING, JobHandle, TaskKey
from ringflow_provider.launchers.lines import JobLine, log_fields
from ringflow_provider.rendered import flag
from ringflow_provider.triggers.job import JobTrigger

XCOM_JOB = "ringflow_job"
DEFAULT_LEASE_S = 1800.0
DEFAULT_POLL_S = 10.0
#: tries after the first when neither the task nor its DAG's default_args say
DEFAULT_RETRIES = 1
# executors whose workers share the host with the triggerer of a one-machine deployment
_LOCAL_EXECUTORS = ("LocalExecutor", "SequentialExecutor", "DebugExecutor")


class RingflowJobOperator(BaseOperator):
    """Base of PopRunOperator and TPTrainOperator (see their docstrings for the arguments
    below).

    :param deferrable: hand the watch of the running job to Airflow's triggerer, freeing the
        worker slot; default ``[operators] default_deferrable`` (False)
    :param poll_interval: seconds between the triggerer's looks at a deferred job, default 10
    :param lease_timeout: seconds a job runs on without anybody watching it before it stops
        itself, default 1800; None: never
    :param on_existing: what a new try does when the previous try's job still runs:
        ``reattach`` (default: watch it to its end) or ``restart`` (stop it, start anew)

    ``retries`` defaults to 1 where neither the task nor ``default_args`` (the DAG's, the task
    group's or the task's) sets it.
    """

    #: how the triggerer reads the job's lines (`triggers.job.presenter`)
    presenter: ClassVar[str] = "plain"

    #: templated like the rest: a DAG's params may choose them
    job_fields: ClassVar[tuple[str, ...]] = ("deferrable", "poll_interval", "lease_timeout",
                                             "on_existing")

    def __init__(self, *, deferrable: bool | str = conf.getboolean(
                     "operators", "default_deferrable", fallback=False),
                 poll_interval: float | str = DEFAULT_POLL_S,
                 lease_timeout: float | str | None = DEFAULT_LEASE_S,
                 on_existing: str = "reattach", **kwargs: Any) -> None:
        # Airflow fills the task's arguments from `default_args` (the DAG's, the task
        # group's and the task's own, merged) only where the call leaves them out, so the
        # provider default goes in only where none of them speaks.
        if "retries" not in (kwargs.get("default_args") or {}):
            kwargs.setdefault("retries", DEFAULT_RETRIES)
        _refuse_unknown(type(self), kwargs)
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.lease_timeout = lease_timeout
        self.on_existing = on_existing
        if not any(_templated(getattr(self, name)) for name in self.job_fields):
            try:
                self._job_options()  # a bad literal fails when the DAG is parsed
            except ValueError as exc:
                raise RingflowConfigException(f"task {self.task_id!r}: {exc}") from None
        # Plain attributes, not threading objects: Airflow deep-copies operators.
        self._killed = False
        self._handle: JobHandle | None = None
        self._launcher: Launcher | None = None
        self._secrets = Secrets()
        self._next_try_attaches = False  # a later try would attach to this try's job

    def _job_options(self) -> None:
        """The rendered watch arguments, checked and typed (ValueError naming the bad one)."""
        self.deferrable = flag("deferrable", self.deferrable)
        self.poll_interval = _seconds("poll_interval", self.poll_interval)
        self.lease_timeout = _seconds("lease_timeout", self.lease_timeout, none_ok=True)
        self.on_existing = str(self.on_existing).strip()
        if self.on_existing not in ON_EXISTING:
            raise ValueError(f"on_existing must be one of {', '.join(ON_EXISTING)}, got "
                             f"{self.on_existing!r}")

    # -- what a subclass says --------------------------------------------------------------
    def new_report(self) -> Any:
        """An object with `feed(JobLine)` that gathers what the job's lines say."""
        raise NotImplementedError

    def present(self, line: JobLine) -> tuple[str, str]:
        """(level, text) of a line for the task log."""
        return ("info" if line.stream == "stdout" else "warning"), line.shown

    def present_options(self) -> dict[str, Any]:
        return {}

    def finish(self, context: Any, handle: JobHandle, report: Any,
               finals: dict[str, dict[str, Any]]) -> Any:
        """The task's result (XCom) from the job's report, or the exception it fails with."""
        raise NotImplementedError

    # -- the one path ----------------------------------------------------------------------
    def run_job(self, context: Any, launcher: Launcher, start: Callable[[], JobHandle],
                where: str = "") -> Any:
        """Attach to the previous try's job if it still runs (and `on_existing` says so),
        else `start()` one; then defer to the triggerer or watch it here, and report."""
        ti = context["ti"]
        task = TaskKey.from_ti(ti)
        try:
            self._job_options()
        except ValueError as exc:
            raise RingflowConfigException(f"task {self.task_id!r}: {exc}") from None
        launcher.check_allowed()  # before anything below connects to a host
        self._launcher = launcher
        if self.deferrable and launcher.name == "local":
            self._check_triggerer_can_see(launcher)
        report = self.new_report()
        offsets: dict[str, int] = {}
        handle = self._running_earlier(launcher, task) if self.on_existing == "reattach" \
            else None
        if handle is not None:
            offsets = self._catch_up(handle, report, task)
        else:
            self._raise_if_killed()
            handle = start()
        self._handle = handle
        if self._killed:  # on_kill came while the job started: it had nothing to stop yet
            launcher.stop(handle, "on_kill: the task was killed in Airflow")
            self._raise_if_killed()
        tie = self.on_existing == "restart" or not _retries_left(ti)
        try:
            ti.xcom_push(key=XCOM_JOB, value=handle.to_dict())
            self._raise_if_killed()
            if self.deferrable:
                self.log.info("deferring: the triggerer watches job %s%s every %g s (lease "
                              "%s)", handle.job_id, where, self.poll_interval,
                              "none" if self.lease_timeout is None
                              else f"{self.lease_timeout:g} s")
                self.defer(trigger=self._trigger(handle, offsets),
                           method_name="execute_complete")
            self._next_try_attaches = not tie
            finals = self._attach(launcher, handle, report, offsets, tie)
        except TaskDeferred:
            raise
        except BaseException:
            if not self._next_try_attaches and not self._killed:
                launcher.stop(handle, "the task failed while it watched the job")
            raise
        self._raise_if_killed()
        return self.finish(context, handle, report, finals)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The triggerer saw the job end (or lost a host): report as the attached path does."""
        handle = JobHandle.from_dict(event["job"])
        self._handle = handle
        if event.get("status") == "refused":  # a host its connection does not allow
            raise RingflowHostNotAllowedException(self._secrets.mask(str(event.get("message"))))
        if event.get("status") == "error":  # the triggerer lost a host
            raise RingflowHostUnreachableException(
                self._secrets.mask(str(event.get("message"))))
        launcher = launcher_for(handle, self.log)
        said = event.get("finals") or {}
        lost = {host: final for host, final in said.items()
                if final.get("state") == "unreachable"}
        try:
            report = self.new_report()
            _, looks = launcher.read_all(handle, report.feed, skip=list(lost))
        except LaunchError as exc:
            raise launch_exception(exc, self._secrets.mask(str(exc))) from None
        finally:
            launcher.close()
        finals = {host: {**(look.status or {}), "state": look.state,
                         **({"frozen": True} if said.get(host, {}).get("frozen") else {})}
                  for host, look in looks.items()}
        return self.finish(context, handle, report, {**finals, **lost})

    def on_kill(self) -> None:
        """Stop the job on every host (returns within about 2 s) and make `execute` raise."""
        self._killed = True
        if self._handle is not None:
            launcher = self._launcher or launcher_for(self._handle, self.log)
            launcher.stop(self._handle, "on_kill: the task was killed in Airflow")

    # -- pieces ----------------------------------------------------------------------------
    def _raise_if_killed(self) -> None:
        if self._killed:
            raise RingflowJobKilledException(f"the job of task {self.task_id!r} was killed "
                                             f"(on_kill); it was stopped on every host")

    def _trigger(self, handle: JobHandle, offsets: dict[str, int]) -> JobTrigger:
        return JobTrigger(job=handle.to_dict(), offsets=offsets,
                          poll_interval=self.poll_interval, presenter=self.presenter,
                          present_options=self.present_options(),
                          secrets=self._secrets.values)

    def _running_earlier(self, launcher: Launcher, task: TaskKey) -> JobHandle | None:
        """The newest earlier try's job, if it still runs with a fresh lease."""
        try:
            earlier = launcher.task_jobs(task)
        except LaunchError as exc:
            self.log.warning("could not look for an earlier try's job: %s", exc)
            return None
        if not earlier:
            return None
        watcher = launcher_for(earlier[0], self.log)
        try:
            running = watcher.running(earlier[0])
        except LaunchError as exc:
            self.log.warning("could not look at try %d's job: %s", earlier[0].try_number, exc)
            running = None
        finally:
            watcher.close()
        return earlier[0] if running else None

    def _catch_up(self, handle: JobHandle, report: Any, task: TaskKey) -> dict[str, int]:
        """Read what the running job printed so far (the report gets all of it, the log
        one line), and return where the watch goes on from."""
        launcher = launcher_for(handle, self.log)
        try:
            offsets, _ = launcher.read_all(handle, report.feed)
        finally:
            launcher.close()
        at = self.progress_text(report)
        self.log.info("try %d: attaching to the running job of try %d%s", task.try_number,
                      handle.try_number, f" at {at}" if at else "")
        return offsets

    def progress_text(self, report: Any) -> str:
        """Where a job is, for the reattach line (`step 140/400`)."""
        return ""

    def _attach(self, launcher: Launcher, handle: JobHandle, report: Any,
                offsets: dict[str, int], tie: bool) -> dict[str, dict[str, Any]]:
        """Watch the job here to its end: every line logged and reported."""
        watcher = launcher if launcher.name == handle.launcher and \
            set(launcher.hosts) >= {p.host for p in handle.parts} else \
            launcher_for(handle, self.log)
        self._launcher = watcher

        def on_line(line: JobLine) -> None:
            report.feed(line)
            self._show(line)

        return watcher.attach(handle, on_line, offsets=offsets, tie=tie)

    def _show(self, line: JobLine) -> None:
        """A line of the job in the task log, masked; a metric line's numbers as fields of its
        record too (`log_fields`)."""
        level, text = self.present(line)
        (self.log.info if level == "info" else self.log.warning)(
            "%s", self._secrets.mask(text), **log_fields(line))

    def _check_triggerer_can_see(self, launcher: Launcher) -> None:
        """A job on this worker can be deferred only where the triggerer runs on the same
        host: the single-machine executors. Elsewhere, say what to do instead."""
        executors = [e.strip().rsplit(".", 1)[-1]
                     for e in conf.get("core", "executor", fallback="").split(",") if e.strip()]
        if executors and all(e in _LOCAL_EXECUTORS for e in executors):
            return
        raise RingflowConfigException(
            f"deferrable=True without hosts runs the job on this worker, which the triggerer "
            f"cannot watch from another machine (executor {', '.join(executors)}): give "
            f"hosts=[...] (this worker's name too) with an ssh connection so the triggerer "
            f"watches the job over SSH, or use deferrable=False")


def _refuse_unknown(cls: type, kwargs: dict[str, Any]) -> None:
    """Airflow's TypeError for arguments no class of the operator takes, with the nearest
    name each (`stpes` -> `steps`), before BaseOperator lists them without one."""
    known = [name for klass in cls.__mro__ if "__init__" in vars(klass)
             and issubclass(klass, BaseOperator)
             for name, p in inspect.signature(klass.__init__).parameters.items()
             if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD]
    unknown = [k for k in kwargs if k not in known and not k.startswith("_")]
    if unknown:
        said = ", ".join(f"{k!r}{did_you_mean(k, known)}" for k in unknown)
        raise TypeError(f"Invalid arguments were passed to {cls.__name__} (task_id: "
                        f"{kwargs.get('task_id')}): {said}")


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _seconds(name: str, value: Any, none_ok: bool = False) -> float | None:
    if none_ok and (value is None or (isinstance(value, str) and value.strip().lower() in
                                      ("", "none", "null", "never"))):
        return None
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        allowed = " or None" if none_ok else ""
        raise ValueError(f"{name} must be a positive number of seconds{allowed}, got "
                         f"{value!r}")
    return seconds


def _retries_left(ti: Any) -> bool:
    """Whether a later try of this task may come (and could attach to its job)."""
    number = int(getattr(ti, "try_number", 0) or 0)
    return 0 < number <= int(getattr(ti, "max_tries", 0) or 0)
