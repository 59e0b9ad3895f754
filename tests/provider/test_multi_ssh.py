"""MultiHostSSHHook against a real OpenSSH server: streaming, exit codes, failures named."""

from __future__ import annotations

import shlex
import socket
import threading
import time

import pytest

from ringflow.errors import LaunchError
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.launchers.commands import find_executable_command
from tests.provider.conftest import (
    BAD_KEY_CONN_ID,
    NETNS_CONN_ID,
    connection_json,
    wait_until,
)

pytestmark = [pytest.mark.ssh]


@pytest.fixture
def hook(ssh_conn):
    hook = MultiHostSSHHook(ssh_conn, conn_timeout=5)
    yield hook
    hook.close()


def collect(lines):
    lock = threading.Lock()

    def sink(stream, line):
        with lock:
            lines.append((stream, line))

    return sink


def test_lines_stream_as_they_arrive_before_the_command_ends(hook, sshd):
    go = sshd.work_dir / "go-stream"
    script = (
        "echo first; printf 'par'; sleep 0.3; echo 'tial'; echo oops >&2; "
        f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; echo last"
    )
    lines: list = []
    command = f"sh -c {shlex.quote(script)}"
    worker = threading.Thread(
        target=lambda: lines.append(("result", hook.stream("127.0.0.1", command, collect(lines)))))
    worker.start()
    try:
        # The command cannot end before `go` exists, so these lines arrived while it ran.
        wait_until(lambda: ("stderr", "oops") in lines, 20, "streamed lines")
        assert [entry for entry in lines if entry[0] == "stdout"] == [
            ("stdout", "first"), ("stdout", "partial")]
    finally:
        go.touch()
        worker.join(20)
    assert ("stdout", "last") in lines
    result = lines[-1][1]
    assert result.exit_code == 0
    assert list(result.tail) == ["first", "partial", "oops", "last"]


def test_exit_code_and_last_lines_come_back(hook):
    command = "sh -c " + shlex.quote("for i in $(seq 1 30); do echo line$i; done; exit 7")
    result = hook.stream("127.0.0.1", command, lambda stream, line: None)
    assert result.exit_code == 7
    assert list(result.tail) == [f"line{i}" for i in range(11, 31)]


def test_a_lost_connection_is_an_error_not_an_exit_code(hook):
    lines: list = []
    outcome: dict = {}

    def run():
        try:
            # Keeps writing, so it ends (SIGPIPE) once the connection is gone.
            hook.stream("127.0.0.1", "echo started; while echo tick; do sleep 0.2; done",
                        collect(lines))
        except LaunchError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    wait_until(lambda: ("stdout", "started") in lines, 20, "the command to start")
    hook.hook_for("127.0.0.1").client.get_transport().close()
    worker.join(20)
    assert "host '127.0.0.1': the SSH channel closed before the command reported an exit " \
           "status" in str(outcome["error"])


def test_cmd_timeout_fails_a_silent_command_naming_the_host(ssh_conn):
    hook = MultiHostSSHHook(ssh_conn, conn_timeout=5, cmd_timeout=0.5)
    try:
        with pytest.raises(LaunchError, match=r"host '127.0.0.1': no output for 0.5 s"):
            hook.stream("127.0.0.1", "sleep 3", lambda stream, line: None)
    finally:
        hook.close()


def test_unreachable_host_fails_within_conn_timeout_naming_it(sshd, monkeypatch):
    # A listener that never accepts: TCP connects, the SSH banner never comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        conn = connection_json(sshd, sshd.key_file).replace(
            f'"port": {sshd.port}', f'"port": {silent.getsockname()[1]}')
        monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_SILENT", conn)
        hook = MultiHostSSHHook("ringflow_silent", conn_timeout=1.5)
        started = time.monotonic()
        with pytest.raises(LaunchError) as info:
            hook.connect("127.0.0.1")
        elapsed = time.monotonic() - started
    assert "cannot open SSH to host '127.0.0.1'" in str(info.value)
    assert "within 1.5 s" in str(info.value)
    # Bounded by conn_timeout, not by SSHHook's 30 s banner wait or its retries (3-5 s each).
    assert elapsed < 1.5 + 2.5


def test_refused_port_fails_naming_host_and_port(sshd, monkeypatch):
    port = sshd.port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    conn = connection_json(sshd, sshd.key_file).replace(f'"port": {port}', f'"port": {closed_port}')
    monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_CLOSED", conn)
    hook = MultiHostSSHHook("ringflow_closed", conn_timeout=2)
    with pytest.raises(LaunchError, match=rf"host '127.0.0.1' \(\S+@127.0.0.1:{closed_port}"):
        hook.connect("127.0.0.1")


def test_a_key_the_server_does_not_accept_fails_naming_the_host(ssh_conn):
    hook = MultiHostSSHHook(BAD_KEY_CONN_ID, conn_timeout=5)
    with pytest.raises(LaunchError, match=r"host 'localhost'.*AuthenticationException"):
        hook.connect("localhost")


def test_preflight_passes_when_every_host_answers_and_poprun_is_found(hook, sshd):
    path = hook.check_hosts(["127.0.0.1", "localhost"], "127.0.0.1", "poprun",
                            find_executable_command("poprun"))
    assert path == str(sshd.bin_dir / "poprun")


def test_a_host_key_other_than_the_connection_pins_is_refused(sshd, monkeypatch):
    """Host keys are checked as the connection says (here: the `host_key` extra)."""
    wrong_key = " ".join((sshd.key_file.with_suffix(".pub")).read_text().split()[:2])
    conn = connection_json(sshd, sshd.key_file).replace(sshd.host_key_line, wrong_key)
    monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_WRONG_HOSTKEY", conn)
    hook = MultiHostSSHHook("ringflow_wrong_hostkey", conn_timeout=5)
    with pytest.raises(LaunchError, match=r"host '127.0.0.1' .*BadHostKeyException"):
        hook.connect("127.0.0.1")


def test_preflight_names_every_failing_host(hook, sshd):
    with pytest.raises(LaunchError) as info:
        hook.check_hosts(["127.0.0.1", "localhost", "127.0.0.3"], "localhost",
                         "poprun-missing", find_executable_command("poprun-missing"))
    message = str(info.value)
    assert message.startswith("preflight failed: ")
    assert "'poprun-missing' not found on launch host 'localhost' (exit 127)" in message
    assert "cannot open SSH to host '127.0.0.3'" in message
    assert "'127.0.0.1'" not in message


@pytest.mark.slow
def test_a_launch_host_that_vanishes_fails_the_stream_within_the_keepalive_bound(
        netns_host):
    """No FIN, no RST, nothing: the host's link goes down mid-job. The SSH keepalives leave
    data unacknowledged and TCP_USER_TIMEOUT ends the connection, so the job's stream fails
    naming the host within keepalive_s + dead_after_s (here 1 + 3 s; by default 10 + 30 s),
    not after TCP's 15 minutes of retransmissions."""
    hook = MultiHostSSHHook(NETNS_CONN_ID, conn_timeout=5, keepalive_s=1, dead_after_s=3)
    lines: list = []
    channel = hook.start_command(netns_host.address, "sh -c 'echo started; sleep 300'",
                                 keep_stdin=True)
    outcome: dict = {}

    def stream():
        try:
            outcome["code"] = hook.pump(netns_host.address, channel, collect(lines)).exit_code
        except LaunchError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    waiter = threading.Thread(target=stream, daemon=True)
    waiter.start()
    try:
        wait_until(lambda: ("stdout", "started") in lines, 20, "the job to start")
        vanished = time.monotonic()
        netns_host.vanish()
        waiter.join(30)
    finally:
        hook.close()
    assert not waiter.is_alive(), "the stream did not notice the host was gone"
    assert "code" not in outcome
    assert str(outcome["error"]).startswith(f"host {netns_host.address!r}: the SSH channel "
                                            "closed before the command reported an exit status")
    assert outcome["at"] - vanished < 1 + 3 + 5      # the bound, plus scheduling slack


def test_the_default_keepalive_bound_is_within_a_minute(ssh_conn):
    from ringflow_provider.hooks.multi_ssh import DEAD_AFTER_S, KEEPALIVE_S

    hook = MultiHostSSHHook(ssh_conn)
    try:
        assert (hook.keepalive_s, hook.dead_after_s) == (KEEPALIVE_S, DEAD_AFTER_S)
        assert KEEPALIVE_S + DEAD_AFTER_S <= 60
        assert hook.hook_for("127.0.0.1").keepalive_interval == KEEPALIVE_S
        sock = hook.connect("127.0.0.1").get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    finally:
        hook.close()


@pytest.mark.slow
def test_10_mib_of_remote_progress_output_streams_as_lines_with_flat_memory(hook, sshd):
    """A progress bar redrawn with \\r over SSH: every redraw is a line, as it comes, and
    the task process does not hold the output (lines are split from bytearrays)."""
    from tests.provider.progress_flood import COUNT, SCRIPT, Redraws

    script = sshd.work_dir / "progress.py"
    script.write_text(SCRIPT)
    seen = Redraws()
    result = hook.stream("127.0.0.1", f"python3 {shlex.quote(str(script))}", seen)
    assert result.exit_code == 0
    assert (seen.lines, seen.bad) == (COUNT, 0)
    growth = seen.growth()
    assert growth < 8 << 20, f"RSS grew {growth / 2**20:.1f} MiB"


def test_a_connection_that_opens_no_more_sessions_is_set_aside_for_a_new_one(netns_host,
                                                                            monkeypatch):
    """The host's sshd allows one session per connection (`MaxSessions 1`): a job's
    lifeline holds it, and a short command on the same connection is refused. The command
    runs on a new connection; the lifeline's channel goes on."""
    netns_host.reconfigure_sshd(lambda text: text.replace("MaxSessions 100", "MaxSessions 1"))
    hook = MultiHostSSHHook(NETNS_CONN_ID, conn_timeout=5)
    try:
        lifeline = hook.start_command(netns_host.address, "cat; echo lifeline-ended",
                                      keep_stdin=True)
        first_client = hook.connect(netns_host.address)
        warned = []
        monkeypatch.setattr(hook.log, "warning", lambda msg, *args: warned.append(msg % args))
        code, out, _ = hook.run(netns_host.address, "echo second", timeout=10)
        assert (code, out) == (0, "second\n")
        assert hook.connect(netns_host.address) is not first_client
        assert warned == [f"host {netns_host.address}: opening an SSH session failed "
                          "(ChannelException(2, 'Connect failed')); trying once on a new "
                          "connection"]
        lifeline.shutdown_write()  # the lifeline's command still runs on the old connection
        lines = []
        assert hook.pump(netns_host.address, lifeline, collect(lines)).exit_code == 0
        assert lines == [("stdout", "lifeline-ended")]
    finally:
        hook.close()
