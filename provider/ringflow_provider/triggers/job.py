"""The deferrable watch of a detached ringflow job (`JobTrigger`), run by Airflow's triggerer.

Every `poll_interval` it looks at each part of the job (`ringflow.launch.jobdir`'s peek: one
`sh` command over the host's one SSH connection, or on this host), logs the new whole lines
through the trigger's logger (Airflow shows them in the task's log) exactly as the attached
path does, and renews the part's lease with the offset it has logged, so a new trigger
(after a triggerer restart or hand-over) goes on from there: no line twice, none lost. When
a part ended badly the others are stopped; when every part ended it fires one event. A host
that does not answer is retried with backoff for `reconnect_s`; then the task fails naming
it (its job stops itself when its lease runs out). Every (re)connect first checks the host
against its connection's ``allowed_hosts`` extra (`hooks.allowed_hosts`): a host outside it
is never reached, and the task fails without retries. `on_kill` (a user marked the task failed
or cleared it) stops the job on every host; a triggerer restart never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ringflow.launch import jobdir
from ringflow.launch.jobdir import boot_id
from ringflow.launch.leftovers import FROZEN_WORDS
from ringflow_provider.hooks.allowed_hosts import AllowedHosts, HostNotAllowedError
from ringflow_provider.jobs.masking import Secrets
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.job import JobHandle, Part
from ringflow_provider.launchers.lines import JobLine, lines_of, log_fields
from ringflow_provider.launchers.watch import lost_host_grace

CLASSPATH = "ringflow_provider.triggers.job.JobTrigger"
PEEK_BYTES = 1 << 20
COMMAND_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 8.0   # on_kill: the job is stopped on every host within 10 s
FAILURE_STOP_TIMEOUT_S = 2.0  # a part failed: the others are asked to stop (a quick command)
COORDINATE_S = 0.2  # how often the watch looks at what the parts' watchers found


def presenter(kind: str, options: dict[str, Any]):
    """The task log's reading of a job's lines, as the operator that started it reads them
    (`tp_train` or `plain`)."""
    if kind == "tp_train":
        from ringflow_provider.tp_train.report import Presenter

        return Presenter(int(options["steps"]), options.get("first_step"))
    return lambda line: ("info" if line.stream == "stdout" else "warning", line.shown)


class HostUnreachable(Exception):
    pass


class _Local:
    """A part on the triggerer's own host: the same shell text, run as a child."""

    def __init__(self) -> None:
        pass

    async def run(self, command: str, timeout: float) -> tuple[int, bytes]:
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", command, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            raise HostUnreachable(f"{command[:40]!r} took more than {timeout:g} s") from None
        return proc.returncode or 0, out

    async def close(self) -> None:
        pass


class _Remote:
    """A part on a host reached with asyncssh: one connection, reused, reopened on failure,
    each (re)open only to a host the connection's ``allowed_hosts`` allows (read anew each
    time, so a list narrowed while the job runs holds from the next reconnect)."""

    def __init__(self, conn_id: str, host: str, connect_timeout: float) -> None:
        self.conn_id, self.host, self.connect_timeout = conn_id, host, connect_timeout
        self._conn: Any = None

    async def run(self, command: str, timeout: float) -> tuple[int, bytes]:
        import asyncssh

        try:
            if self._conn is None:
                from airflow.providers.common.compat.connection import get_async_connection
                from airflow.providers.ssh.hooks.ssh import SSHHookAsync

                conn = await get_async_connection(self.conn_id)
                AllowedHosts.of(self.conn_id, conn.extra_dejson).check([self.host],
                                                                       self.conn_id)
                hook = SSHHookAsync(ssh_conn_id=self.conn_id, host=self.host,
                                    keepalive_interval=10)
                self._conn = await asyncio.wait_for(hook.get_conn(),
                                                    min(self.connect_timeout, timeout))
            # the whole command within `timeout`: opening a channel on a connection whose
            # host vanished waits for the keepalive otherwise (30 s and more)
            result = await asyncio.wait_for(
                self._conn.run(command, timeout=timeout, check=False, encoding=None), timeout)
        except (OSError, asyncssh.Error, asyncio.TimeoutError, TimeoutError) as exc:
            await self.close()
            raise HostUnreachable(f"{type(exc).__name__}: {exc}") from None
        return result.exit_status or 0, result.stdout or b""

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                conn.close()
                await asyncio.wait_for(conn.wait_closed(), 1)


class JobTrigger(BaseTrigger):
    """Watches the job of `job` (a `JobHandle` as a dict) until every part ended.

    :param job: the job's handle
    :param offsets: host -> how far its output was logged already
    :param poll_interval: seconds between looks
    :param presenter: how lines read in the task log (`tp_train` or `plain`)
    :param present_options: the presenter's options (`steps` for `tp_train`)
    :param secrets: values to mask in every line (the trigger's arguments are encrypted
        with Airflow's Fernet key in the metadata database)
    :param reconnect_s: how long a host may not answer before the task fails
    """

    def __init__(self, job: dict[str, Any], offsets: dict[str, int] | None = None,
                 poll_interval: float = 10.0, presenter: str = "plain",
                 present_options: dict[str, Any] | None = None,
                 secrets: list[str] | None = None, reconnect_s: float = 120.0,
                 connect_timeout: float = 10.0) -> None:
        super().__init__()
        self.job = job
        self.offsets = dict(offsets or {})
        self.poll_interval = poll_interval
        self.presenter = presenter
        self.present_options = dict(present_options or {})
        self.secrets = list(secrets or [])
        self.reconnect_s = reconnect_s
        self.connect_timeout = connect_timeout
        self._frozen: set[str] = set()  # hosts whose stop found the job's processes halted

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "job": self.job, "offsets": self.offsets, "poll_interval": self.poll_interval,
            "presenter": self.presenter, "present_options": self.present_options,
            "secrets": self.secrets, "reconnect_s": self.reconnect_s,
            "connect_timeout": self.connect_timeout}

    def __repr__(self) -> str:  # the triggerer logs it: never the secrets
        handle = self.job
        return (f"<JobTrigger job {handle.get('job_id')} of {handle.get('task')} on "
                f"{', '.join(p['host'] for p in handle.get('parts', []))}>")

    # -- the watch ---------------------------------------------------------------------------
    async def run(self) -> AsyncIterator[TriggerEvent]:
        handle = JobHandle.from_dict(self.job)
        self._handle = handle
        self._shells = {p.host: self._shell(p) for p in handle.parts}
        self._mask = Secrets(self.secrets)
        self._present = presenter(self.presenter, self.present_options)
        try:
            event = await self._watch(handle)
        except HostNotAllowedError as exc:  # not retried: the operator fails the task at once
            self.log.error("job %s: %s", handle.job_id, exc)
            event = {"status": "refused", "message": str(exc)}
        except Exception as exc:  # an event, not a traceback: the task says what happened
            self.log.exception("the watch of job %s failed", handle.job_id)
            event = {"status": "error", "message": f"the watch of job {handle.job_id} "
                                                   f"failed: {type(exc).__name__}: {exc}"}
        finally:
            await self._close()
        yield TriggerEvent({**event, "job": self.job, "offsets": self.offsets})

    def _shell(self, part: Part) -> _Local | _Remote:
        if part.conn_id is None:
            return _Local()
        return _Remote(part.conn_id, part.host, self.connect_timeout)

    async def _watch(self, handle: JobHandle) -> dict[str, Any]:
        await self._check_local_parts(handle)
        first = await asyncio.gather(*(self._look(p, 0, 0) for p in handle.parts))
        for part, look in zip(handle.parts, first):
            if look is not None:  # what an earlier watcher of the job logged already
                self.offsets[part.host] = max(self.offsets.get(part.host, 0), look.shown)
        self.log.info("the triggerer watches job %s on %s every %g s", handle.job_id,
                      ", ".join(p.host for p in handle.parts), self.poll_interval)
        finals: dict[str, dict[str, Any]] = {}
        answered = {p.host: time.monotonic() for p in handle.parts}  # last answer of each
        state: dict[str, Any] = {"stopping": None, "lost": None}
        grace = lost_host_grace(handle)

        async def watch_part(part: Part) -> None:
            """Poll one part until it ended; each part on its own, so a host that does not
            answer never delays what the others report."""
            silent_since: float | None = None
            while True:
                # once another part failed, a host gets only short looks: a lost one must
                # not hold the report back
                polled = await self._poll(part, COMMAND_TIMEOUT_S if state["stopping"] is None
                                          else max(1.0, grace))
                now = time.monotonic()
                if polled is None:
                    silent_since = silent_since or now
                    if now - silent_since > self.reconnect_s and state["stopping"] is None:
                        state["lost"] = self._lost(part, finals)
                        return
                else:
                    silent_since = None
                    # when the host answered the look, not when the lease renewal after it
                    # gave up: a host cut off meanwhile must not count as answering later
                    look, answered[part.host] = polled
                    if look.state in (jobdir.ENDED, jobdir.LOST) and not look.data:
                        finals[part.host] = {**(look.status or {}), "state": look.state}
                        if part.host in self._frozen:
                            finals[part.host]["frozen"] = True
                        return
                await asyncio.sleep(self._pause(silent_since))

        watchers = {p.host: asyncio.ensure_future(watch_part(p)) for p in handle.parts}
        try:
            while True:
                await asyncio.sleep(COORDINATE_S)
                for watcher in watchers.values():  # a refused host, a bug: the run says so
                    if watcher.done() and not watcher.cancelled() and watcher.exception():
                        raise watcher.exception()
                if state["lost"] is not None:
                    return state["lost"]
                if len(finals) == len(handle.parts):
                    return self._ended(finals)
                failed = [h for h, f in finals.items() if f.get("exit_code") != 0
                          or f["state"] != jobdir.ENDED]
                if failed and state["stopping"] is None:
                    state["stopping"] = time.monotonic()
                    await self._stop_parts([p for p in handle.parts if p.host not in finals],
                                           f"the job's part on {failed[0]} ended badly",
                                           timeout=FAILURE_STOP_TIMEOUT_S)
                stopping = state["stopping"]
                if stopping is not None and time.monotonic() - stopping > grace:
                    for host, watcher in watchers.items():
                        if host not in finals and answered[host] < stopping:
                            # another part failed and this host has not answered since:
                            # lost, the root cause the report names (its ranks stop by
                            # themselves once they miss their peers' heartbeats)
                            watcher.cancel()
                            finals[host] = {"state": "unreachable", "exit_code": None,
                                            "cause": f"host {host} did not answer for "
                                                     f"{time.monotonic() - answered[host]:.0f}"
                                                     " s, after another part failed"}
                    if len(finals) == len(handle.parts):
                        return self._ended(finals)
        finally:
            for watcher in watchers.values():
                watcher.cancel()
            # a watcher in the middle of connecting to a lost host may take its connect
            # timeout to honour the cancel: the event does not wait for it
            await asyncio.wait(list(watchers.values()), timeout=1.0)

    def _pause(self, silent_since: float | None) -> float:
        """The poll interval; while the host is silent, a backoff (capped, with jitter) so
        reconnects neither hammer it nor all come at once."""
        if silent_since is None:
            return self.poll_interval
        waited = time.monotonic() - silent_since
        return min(self.poll_interval, 1.0 + waited / 4) * random.uniform(0.8, 1.2)

    async def _poll(self, part: Part, timeout: float = COMMAND_TIMEOUT_S
                    ) -> tuple[jobdir.Peek, float] | None:
        """One look at a part: new lines logged, the lease renewed with the offset logged;
        with the time (monotonic) the host answered the look. None when the host did not
        answer within `timeout`."""
        offset = self.offsets.get(part.host, 0)
        look = await self._look(part, offset, PEEK_BYTES, timeout)
        answered_at = time.monotonic()
        if look is None:
            return None
        data = look.data
        if data:
            self._log_output(part, data)
            self.offsets[part.host] = offset + len(data)
        with contextlib.suppress(HostUnreachable):
            await self._shells[part.host].run(
                jobdir.renew_command(part.job_dir, self.offsets.get(part.host, 0)), timeout)
        return jobdir.Peek(look.status, look.alive, look.size, data, look.shown,
                           look.lease_age), answered_at

    async def _look(self, part: Part, offset: int, max_bytes: int,
                    timeout: float = COMMAND_TIMEOUT_S) -> jobdir.Peek | None:
        try:
            _, out = await self._shells[part.host].run(
                jobdir.peek_command(part.job_dir, offset, max_bytes), timeout)
        except HostUnreachable as exc:
            self.log.warning("host %s did not answer (%s); trying again", part.host, exc)
            return None
        return jobdir.parse_peek(out)

    def _log_output(self, part: Part, data: bytes) -> None:
        for line in lines_of(data, self._handle, part.host):
            self._log_line(line)

    def _log_line(self, line: JobLine) -> None:
        level, text = self._present(line)
        (self.log.info if level == "info" else self.log.warning)(
            "%s", self._mask.mask(text), **log_fields(line))

    async def _check_local_parts(self, handle: JobHandle) -> None:
        """A part on `this host` can only be watched on its host."""
        for part in handle.parts:
            if part.conn_id is not None:
                continue
            look = await self._look(part, 0, 0)
            here = boot_id()
            there = (look.status or {}).get("boot_id") if look else None
            if look is None or look.status is None or (there and there != here):
                raise RuntimeError(
                    f"the job runs on the Airflow worker {part.host}, but this triggerer runs "
                    f"on another host and cannot see it; run the triggerer on the workers' "
                    f"host, or give the task hosts=[...] with an ssh connection so the job can "
                    f"be watched over SSH, or use deferrable=False")

    def _ended(self, finals: dict[str, dict[str, Any]]) -> dict[str, Any]:
        ok = all(f.get("state") == jobdir.ENDED and f.get("exit_code") == 0
                 for f in finals.values())
        return {"status": "success" if ok else "failed", "finals": finals}

    def _lost(self, part: Part, finals: dict[str, dict[str, Any]]) -> dict[str, Any]:
        lease = self._handle.lease_timeout
        after = f"; its lease stops it within {lease:g} s" if lease else ""
        return {"status": "error", "finals": finals, "host": part.host,
                "message": f"lost contact with host {part.host}: it did not answer for "
                           f"{self.reconnect_s:g} s; the job may still run there{after}"}

    # -- stopping ----------------------------------------------------------------------------
    async def _stop_parts(self, parts: list[Part], why: str,
                          shells: dict[str, _Local | _Remote] | None = None,
                          timeout: float = STOP_TIMEOUT_S) -> None:
        handle = self._handle
        runtime = Runtime(handle.python, handle.pythonpath)
        shells = self._shells if shells is None else shells

        async def stop(part: Part) -> None:
            try:
                _, out = await shells[part.host].run(
                    commands.stop_command(runtime, part.job_dir, why), timeout)
                said = out.decode(errors="replace").strip()
                if FROZEN_WORDS in said:
                    self._frozen.add(part.host)
                self.log.info("stopping the job on %s: %s", part.host, said)
            except (HostUnreachable, HostNotAllowedError) as exc:
                self.log.error("could not reach %s to stop the job: %s", part.host, exc)

        await asyncio.gather(*(stop(p) for p in parts))

    async def on_kill(self) -> None:
        """A user marked the deferred task failed (or cleared it): stop the job everywhere."""
        handle = JobHandle.from_dict(self.job)
        self._handle = handle
        shells = {p.host: self._shell(p) for p in handle.parts}  # run()'s may be closing
        try:
            await asyncio.wait_for(self._stop_parts(
                list(handle.parts), "the task was stopped in Airflow (marked failed or "
                                    "cleared)", shells), STOP_TIMEOUT_S + 1)
        finally:
            for shell in shells.values():
                await shell.close()

    async def _close(self) -> None:
        for shell in getattr(self, "_shells", {}).values():
            await shell.close()
