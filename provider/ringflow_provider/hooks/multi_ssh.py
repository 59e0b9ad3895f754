"""SSH to several hosts with one `ssh` connection: reachability checks and streamed commands.

Built on apache-airflow-providers-ssh's `SSHHook` (credentials, host-key policy and extras as
the connection says); one `SSHHook` per host, made lazily, with the connection's port and the
host name from the job. What this adds: bounded connects (no retries, banner and auth bounded
by the same timeout), the connection's ``allowed_hosts`` extra checked before any connect
(`allowed_hosts`), whole-line streaming (`ringflow_provider.jobs.lines`) with an optional
inactivity limit, SFTP sessions with a deadline on every reply, and errors that name the
host. `ringflow_provider.launchers` runs jobs on top of it (`launchers.shells.SSHShell`);
`ringflow_provider.launchers.shipping` ships the runtime with it.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import paramiko
from airflow.providers.ssh.hooks.ssh import SSHHook
from airflow.sdk import BaseHook

from ringflow.errors import HostUnreachableError, LaunchError, gathered
from ringflow_provider.hooks.allowed_hosts import AllowedHosts
from ringflow_provider.jobs.lines import TAIL_LINES, LineSink, LineSplitter

__all__ = ["LineSink", "MultiHostSSHHook", "StreamResult"]

_READ_CHUNK = 65536
_TICK_S = 0.5
# How long output may still come after the exit status when no EOF comes (a background child
# of the command holds its stdout open)
_DRAIN_AFTER_EXIT_S = 2.0
# A host that vanishes (power, network) sends no FIN or RST: TCP alone would retransmit for
# about 15 minutes. An SSH keepalive every KEEPALIVE_S leaves data unacknowledged on such a
# link, and TCP_USER_TIMEOUT drops the connection once data stayed unacknowledged for
# DEAD_AFTER_S: the stream then fails within KEEPALIVE_S + DEAD_AFTER_S (40 s).
KEEPALIVE_S = 10
DEAD_AFTER_S = 30


@dataclass
class StreamResult:
    """How a streamed remote command ended."""

    exit_code: int
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))


class MultiHostSSHHook(BaseHook):
    """SSH to the hosts of one job with the credentials of one `ssh` connection.

    :param ssh_conn_id: the Airflow connection of type ``ssh`` (login, key or password,
        port, host-key extras); its host is replaced by each job host, which must be among
        its ``allowed_hosts`` extra when it has one (`allowed_hosts`).
    :param conn_timeout: seconds for TCP connect, SSH banner and authentication each.
    :param cmd_timeout: seconds without any output before a streamed command fails;
        None (the default) means no limit.
    :param keepalive_s: seconds between SSH keepalives on an idle connection.
    :param dead_after_s: seconds the peer may leave sent data unacknowledged before the
        connection counts as lost (TCP_USER_TIMEOUT).
    """

    conn_name_attr = "ssh_conn_id"
    default_conn_name = "ssh_default"
    conn_type = "ssh"
    hook_name = "SSH (ringflow, several hosts)"

    def __init__(self, ssh_conn_id: str = default_conn_name, conn_timeout: float = 10,
                 cmd_timeout: float | None = None, keepalive_s: int = KEEPALIVE_S,
                 dead_after_s: float = DEAD_AFTER_S):
        super().__init__()
        self.ssh_conn_id = ssh_conn_id
        self.conn_timeout = conn_timeout
        self.cmd_timeout = cmd_timeout
        self.keepalive_s = max(int(keepalive_s), 1)
        self.dead_after_s = dead_after_s
        self._hooks: dict[str, SSHHook] = {}
        self._allowed: AllowedHosts | None = None
        self._set_aside_clients: list[paramiko.SSHClient] = []

    @property
    def allowed(self) -> AllowedHosts:
        """The connection's ``allowed_hosts``, read once."""
        if self._allowed is None:
            try:
                extra = self.get_connection(self.ssh_conn_id).extra_dejson
            except Exception as exc:  # not defined, a secrets backend down: said as it came
                raise LaunchError(f"ssh connection {self.ssh_conn_id!r} cannot be read: "
                                  f"{type(exc).__name__}: {exc}") from exc
            self._allowed = AllowedHosts.of(self.ssh_conn_id, extra)
        return self._allowed

    def check_allowed(self, hosts: list[str]) -> None:
        """HostNotAllowedError (a LaunchError) naming a host of `hosts` the connection's
        ``allowed_hosts`` does not allow; nothing is connected."""
        self.allowed.check(hosts, self.ssh_conn_id)

    def hook_for(self, host: str) -> SSHHook:
        if host not in self._hooks:
            self._hooks[host] = SSHHook(
                ssh_conn_id=self.ssh_conn_id,
                remote_host=host,
                conn_timeout=self.conn_timeout,
                cmd_timeout=self.cmd_timeout,
                banner_timeout=self.conn_timeout,
                auth_timeout=self.conn_timeout,
                conn_retry_attempts=1,
                keepalive_interval=self.keepalive_s,
            )
        return self._hooks[host]

    def describe(self, host: str) -> str:
        hook = self.hook_for(host)
        return f"{hook.username}@{host}:{hook.port}"

    def connect(self, host: str) -> paramiko.SSHClient:
        """An open client to `host`, or HostUnreachableError naming the host and the cause;
        HostNotAllowedError, before any connect, for a host the connection does not allow."""
        self.check_allowed([host])
        try:
            hook = self.hook_for(host)
            client = hook.get_conn()
            _bound_silence(client, self.keepalive_s, self.dead_after_s)
            return client
        except Exception as exc:
            where = f"host {host!r} (connection {self.ssh_conn_id!r})"
            if host in self._hooks:
                where = f"host {host!r} ({self.describe(host)}, connection {self.ssh_conn_id!r})"
            raise HostUnreachableError(
                f"cannot open SSH to {where} within {self.conn_timeout} s: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def run(self, host: str, command: str, timeout: float) -> tuple[int, str, str]:
        """Run a short command and collect its output; every wait bounded by `timeout`."""
        channel = self.open_session(host)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            stdout, stderr = channel.makefile("rb"), channel.makefile_stderr("rb")
            channel.shutdown_write()
            out, err = stdout.read(), stderr.read()
            if not channel.status_event.wait(timeout):
                raise LaunchError(f"host {host!r}: {command[:60]!r} gave no exit status "
                                  f"within {timeout} s")
            code = channel.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise LaunchError(f"host {host!r}: {command[:60]!r} failed: {_said(exc)}") from exc
        finally:
            channel.close()
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def open_session(self, host: str) -> paramiko.Channel:
        """A new session channel to `host`, its opening bounded by conn_timeout. A
        connection that is up but does not open a channel (no answer, or a refusal) is set
        aside, its open channels untouched (a job's lifeline may be one), and one new
        connection is tried; LaunchError naming the host and both causes if that fails
        too."""
        first: Exception | None = None
        while True:
            client = self.connect(host)
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise LaunchError(f"host {host!r}: SSH transport closed before a session "
                                  "opened")
            try:
                return transport.open_session(timeout=self.conn_timeout)
            # EOFError: paramiko raises what ended its transport (the peer closed it)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if first is not None:
                    raise LaunchError(
                        f"host {host!r}: cannot open an SSH session: {_said(first)}; on a "
                        f"new connection: {_said(exc)}") from exc
                first = exc
                self.log.warning("host %s: opening an SSH session failed (%s); trying once "
                                 "on a new connection", host, _said(exc))
                self._set_aside(host)

    def _set_aside(self, host: str) -> None:
        """The host's hook connects anew next time; its old client is closed with the
        hook (`close`)."""
        hook = self._hooks[host]
        if hook.client is not None:
            self._set_aside_clients.append(hook.client)
            hook.client = None

    def open_sftp(self, host: str, timeout: float | None = None) -> paramiko.SFTPClient:
        """An SFTP session to `host` whose every wait for a reply is bounded by `timeout`
        (default: conn_timeout); LaunchError naming the host if it cannot be opened."""
        timeout = self.conn_timeout if timeout is None else timeout
        channel = self.open_session(host)
        gave_up = threading.Event()

        def give_up() -> None:
            gave_up.set()
            channel.close()

        try:
            # paramiko waits for the subsystem's answer without a deadline; closing the
            # channel ends that wait.
            timer = threading.Timer(timeout, give_up)
            timer.start()
            try:
                channel.invoke_subsystem("sftp")
            finally:
                timer.cancel()
            channel.settimeout(timeout)  # bounds each SFTP reply
            return paramiko.SFTPClient(channel)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            channel.close()
            cause = (f"no answer within {timeout} s"
                     if gave_up.is_set() or isinstance(exc, TimeoutError)
                     else f"{type(exc).__name__}: {exc}")
            raise LaunchError(f"host {host!r}: cannot open SFTP: {cause}") from exc

    def check_hosts(self, hosts: list[str], launch_host: str, executable: str,
                    find_command: str) -> str:
        """Every host reachable and `executable` found on the launch host (its path is
        returned); else one error naming every failing host."""
        found: list[str] = []

        def check(host: str) -> LaunchError | str | None:
            try:
                if host != launch_host:
                    self.connect(host)
                    return None
                code, out, _ = self.run(host, find_command, timeout=self.conn_timeout)
            except LaunchError as exc:
                return exc
            if code != 0:
                return f"{executable!r} not found on launch host {host!r} (exit {code})"
            found.append(out.strip())
            return None

        targets = list(dict.fromkeys([*hosts, launch_host]))
        with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
            problems = [p for p in pool.map(check, targets) if p]
        if problems:
            raise gathered("preflight", problems)
        return found[0]

    def stream(self, host: str, command: str, sink: LineSink,
               should_stop: Callable[[], bool] = lambda: False) -> StreamResult:
        """Run `command` on `host`, passing each whole output line to `sink` as it arrives."""
        channel = self.start_command(host, command)
        try:
            return self.pump(host, channel, sink, should_stop)
        finally:
            channel.close()

    def start_command(self, host: str, command: str, stdin_text: str = "",
                      keep_stdin: bool = False) -> paramiko.Channel:
        """Start `command` on `host` in a new channel; `stdin_text` (secrets, never on the
        command line) is written to its stdin, which is then closed, or with `keep_stdin`
        left open (the command's lifeline: it ends when the channel does); `pump` streams
        it."""
        channel = self.open_session(host)
        try:
            channel.exec_command(command)
            if stdin_text:
                channel.sendall(stdin_text.encode())
            if not keep_stdin:
                channel.shutdown_write()
        except (OSError, paramiko.SSHException) as exc:
            channel.close()
            raise LaunchError(f"host {host!r}: cannot start the command: {exc}") from exc
        return channel

    def pump(self, host: str, channel: paramiko.Channel, sink: LineSink,
             should_stop: Callable[[], bool] = lambda: False) -> StreamResult:
        """Pass the channel's whole output lines to `sink` until the command ends (or
        `should_stop()`); the exit code is -1 when none came."""
        result = StreamResult(exit_code=-1)
        try:
            self._pump(host, channel, sink, result, should_stop)
        except (OSError, paramiko.SSHException) as exc:
            raise HostUnreachableError(
                f"host {host!r}: the SSH stream failed ({type(exc).__name__}: {exc}); the "
                f"command may still be running there") from exc
        return result

    def _pump(self, host: str, channel: paramiko.Channel, sink: LineSink,
              result: StreamResult, should_stop: Callable[[], bool]) -> None:
        out = LineSplitter("stdout", sink, result.tail)
        err = LineSplitter("stderr", sink, result.tail)
        last_output = time.monotonic()
        exit_seen: float | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(channel, selectors.EVENT_READ)
            while not should_stop():
                got = False
                while channel.recv_ready():
                    out.feed(channel.recv(_READ_CHUNK))
                    got = True
                while channel.recv_stderr_ready():
                    err.feed(channel.recv_stderr(_READ_CHUNK))
                    got = True
                if exit_seen is None and channel.exit_status_ready():
                    exit_seen = time.monotonic()
                if got:
                    last_output = time.monotonic()
                elif channel.closed or (exit_seen is not None and (
                        # sshd reports the exit when the command ends, which can be before
                        # it has read the command's last output from the pipe: the end of
                        # the output is its EOF, unless a child the command left behind
                        # holds the pipe open
                        channel.eof_received
                        or time.monotonic() - max(exit_seen, last_output) > _DRAIN_AFTER_EXIT_S)):
                    break
                elif self.cmd_timeout is not None and (
                    time.monotonic() - last_output > self.cmd_timeout
                ):
                    raise LaunchError(
                        f"host {host!r}: no output for {self.cmd_timeout} s (cmd_timeout)"
                    )
                else:
                    selector.select(_TICK_S)
        # The transport thread may have taken the last data and the exit status in between
        # the readiness checks above: what arrived before the exit status is still buffered.
        while channel.recv_ready():
            out.feed(channel.recv(_READ_CHUNK))
        while channel.recv_stderr_ready():
            err.feed(channel.recv_stderr(_READ_CHUNK))
        out.flush()
        err.flush()
        if channel.exit_status_ready():
            result.exit_code = channel.recv_exit_status()  # -1: none came (signal, lost link)
        transport = channel.get_transport()
        lost = transport is None or not transport.is_active()
        if result.exit_code == -1 and lost and not should_stop():
            raise LaunchError(
                f"host {host!r}: the SSH channel closed before the command reported an exit "
                "status (connection lost?); it may still be running there"
            )

    def close(self) -> None:
        for hook in self._hooks.values():
            if hook.client is not None:
                hook.client.close()
                hook.client = None
        for client in self._set_aside_clients:
            client.close()
        self._set_aside_clients.clear()


def _said(exc: BaseException) -> str:
    """An exception as a cause in a message: its text, or its type when it has none
    (paramiko's EOFError for a connection the peer closed)."""
    return str(exc) or type(exc).__name__


def _bound_silence(client: paramiko.SSHClient, keepalive_s: int, dead_after_s: float) -> None:
    """TCP-level bounds on a connection whose peer may vanish without a word (see
    KEEPALIVE_S); a no-op for a connection that is not a TCP socket (a proxy command)."""
    transport = client.get_transport()
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", keepalive_s), ("TCP_KEEPINTVL", keepalive_s),
                          ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", int(dead_after_s * 1000))):
        if hasattr(socket, option):  # Linux; elsewhere TCP's own timers apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
