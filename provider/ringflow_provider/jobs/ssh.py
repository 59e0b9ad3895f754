"""SSHJob: a command on a remote host, started over SSH in its own session, its process
group recorded per try, streamed as whole lines, stopped by one detached remote command.

The shell text (launch script with `setsid -w`, pid file `try-<n>.pgid`, the task marker
that keeps a reused group id safe, the kill script) is `ringflow_provider.remote_job`; this
module runs it through `MultiHostSSHHook`. A retry's launch script first stops what an
earlier try of the same task left running.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import paramiko

from ringflow.errors import LaunchError
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.jobs.lines import TAIL_LINES, LineSink
from ringflow_provider.remote_job import (
    JobId,
    kill_command,
    launch_command,
    parse_pgid,
    secrets_stdin,
)

# Airflow sends SIGKILL about 5 s after the SIGTERM that runs on_kill; stay well inside.
ON_KILL_BUDGET_S = 1.8


class SSHJob:
    """One command run detached on `host` for one task try (`job`).

    :param hook: SSH to the job's hosts (its connection's credentials)
    :param host: where the command runs
    :param job: the task try it belongs to (names its pid file and its marker)
    :param argv: the command (quoted token by token for the remote shell)
    :param on_line: called as ``on_line(stream, line)`` for every whole output line, in the
        thread that calls :meth:`wait`, with the line as the job printed it (mask it before
        logging); the job's own `ringflow-pgid=N` line is taken out and logged
    :param env: exported in the remote shell before the command (quoted: visible in the
        remote command lines, so nothing secret)
    :param secret_env: exported in the remote shell from the channel's stdin, so the values
        sit on no command line on either side (one line each: no line break or NUL)
    :param job_stdin: instead, the first line of the job's own stdin (a ringflow launcher
        agent's ``--stdin`` secrets line), which then stays open for the job's life: the
        agent stops its ranks when it ends (the Airflow side is gone)
    :param state_dir: the remote directory of the pid files (None: ``$HOME/.ringflow/jobs``)
    :param log: where the job's own messages go (the operator's logger)
    :param should_stop: polled while streaming; True ends :meth:`wait` (the job runs on)
    """

    def __init__(self, hook: MultiHostSSHHook, host: str, job: JobId, argv: Sequence[str],
                 on_line: LineSink, *, env: Mapping[str, str] | None = None,
                 secret_env: Mapping[str, str] | None = None, job_stdin: str | None = None,
                 state_dir: str | None = None, log: Any = None,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
        self.hook = hook
        self.host = host
        self.job = job
        self.argv = list(argv)
        self.on_line = on_line
        self.env = dict(env or {})
        self.secret_env = dict(secret_env or {})
        if job_stdin is not None and self.secret_env:
            raise LaunchError("SSHJob takes secret_env or job_stdin, not both")
        self._job_stdin = job_stdin
        self._stdin = job_stdin if job_stdin is not None else secrets_stdin(
            list(self.secret_env), self.secret_env)  # checks values
        self.state_dir = state_dir
        self.log = log if log is not None else logging.getLogger(__name__)
        self.pgid: int | None = None
        self.exit_code: int | None = None  # -1: the remote shell gave no exit status
        self._should_stop = should_stop
        self._channel: paramiko.Channel | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._stop_requested = False

    def __repr__(self) -> str:
        return f"SSHJob({self.job}, host={self.host!r}, pgid={self.pgid})"

    @property
    def tail(self) -> list[str]:
        """The last lines of stdout and stderr, in the order they came."""
        return list(self._tail)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def start(self) -> None:
        """Send the launch command; LaunchError if the host cannot be reached."""
        if self._channel is not None:
            raise LaunchError(f"{self!r} was started already")
        if self._stop_requested:
            raise LaunchError(f"job {self.job} was stopped before it started")
        command = launch_command(self.job, self.argv, self.env, self.state_dir,
                                 secret_names=list(self.secret_env),
                                 stdin_to_job=self._job_stdin is not None)
        self._channel = self.hook.start_command(self.host, command, self._stdin,
                                                keep_stdin=self._job_stdin is not None)

    def wait(self) -> int:
        """Stream output to `on_line` until the command ends (or streaming is stopped);
        returns its exit code (128+N for signal N, -1 for none). LaunchError when the
        stream fails (cmd_timeout, a lost connection): the job may still run there."""
        if self._channel is None:
            raise LaunchError("wait() before start()")
        try:
            result = self.hook.pump(self.host, self._channel, self._on_output,
                                    lambda: self._stop_requested or self._should_stop())
        finally:
            self.close()
        self.exit_code = result.exit_code
        return result.exit_code

    def _on_output(self, stream: str, line: str) -> None:
        if self.pgid is None and stream == "stdout" and (pgid := parse_pgid(line)):
            self.pgid = pgid
            self.log.info("job %s runs as process group %d", self.job, pgid)
            return
        self._tail.append(line)
        self.on_line(stream, line)

    def stop(self, why: str = "on_kill", timeout_s: float = ON_KILL_BUDGET_S,
             block: bool = False) -> str:
        """Send the detached kill command (TERM the group now, KILL it 5 s later, in the
        background on the host; before the job wrote its pid file, the killer waits for it)
        and end streaming. Returns what the host said ("" if it could not be reached in
        time). Unless `block`, returns within `timeout_s` even if the host is slow."""
        said: list[str] = []
        if block:
            said.append(self._send_kill(why, timeout_s))
        else:
            sender = threading.Thread(target=lambda: said.append(self._send_kill(why, timeout_s)),
                                      name=f"ringflow-kill-{self.job.task_key}", daemon=True)
            sender.start()
            sender.join(timeout_s)
            if sender.is_alive():
                self.log.warning("%s: the kill command for %s is still being sent", why, self.job)
        self._stop_requested = True
        return said[0] if said else ""

    def _send_kill(self, why: str, timeout_s: float) -> str:
        command = kill_command(self.job, self.pgid, self.state_dir)
        hook = self.hook
        try:
            client = hook.hook_for(self.host).client
            transport = client.get_transport() if client else None
            if transport is None or not transport.is_active():  # closed by a failure
                hook = MultiHostSSHHook(self.hook.ssh_conn_id, timeout_s, None)
            code, out, err = hook.run(self.host, command, timeout=timeout_s)
            said = (out + err).strip() or f"exit {code}"
            self.log.info("%s on %s: %s", why, self.host, said)
            return said
        except Exception as exc:  # a stop must never raise into Airflow's signal handler
            self.log.error("%s: could not reach %s to kill job %s: %s", why, self.host,
                           self.job, exc)
            return ""
        finally:
            if hook is not self.hook:
                hook.close()

    def close(self) -> None:
        """Close the channel (the job runs on: it is detached); the hook stays open."""
        if self._channel is not None:
            self._channel.close()
