"""The rendezvous handshake proves the job token both ways without sending it, and a rank's
listener survives abuse: a squatter on a rank's port learns nothing it can use; a listener
under an fd flood, hundreds of idle connections, a one-byte-per-second client and garbage
frames still lets a legitimate rank join within its deadline, and its threads come back to
their baseline."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest

from ringflow.distributed.collective import rendezvous
from ringflow.distributed.collective.transport.base import Deadline, OpContext
from ringflow.distributed.env import Endpoint
from ringflow.errors import CommError
from tests.runtime.distributed.spawn import WORKERS, free_ports

JOB, TOKEN = "job1", "tok-" + "9f" * 16
KEY = rendezvous.JobKey(JOB, TOKEN)
CTX = OpContext(1, 0, "init", host="127.0.0.1")


def _connect(port: int, seconds: float = 5.0, key: rendezvous.JobKey = KEY, rank: int = 1):
    return rendezvous.connect(Endpoint("127.0.0.1", port), key, rendezvous.KIND_RING, 0, rank,
                              0, Deadline(seconds), CTX)


class Squatter:
    """A process-less impostor on a rank's port: records every byte it receives and answers
    the hello with a challenge it made up (it cannot compute the real one)."""

    def __init__(self, port: int, relay_to: int | None = None) -> None:
        self.received = bytearray()
        self.sock = socket.create_server(("127.0.0.1", port))
        self.relay_to = relay_to
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(5)
            hello = conn.recv(rendezvous._HELLO.size)
            self.received += hello
            if self.relay_to is None:
                conn.sendall(rendezvous._CHALLENGE.pack(b"RFL2", 4242, os.urandom(16),
                                                        os.urandom(32)))
            else:   # a man in the middle forwarding to another rank's real listener
                with socket.create_connection(("127.0.0.1", self.relay_to)) as up:
                    up.sendall(hello)
                    conn.sendall(up.recv(rendezvous._CHALLENGE.size))
            with suppress(OSError):
                self.received += conn.recv(1024)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def test_a_squatter_on_a_ranks_port_fails_the_dialer_naming_the_endpoint():
    port, = free_ports(1)
    squatter = Squatter(port)
    try:
        with pytest.raises(CommError) as err:
            _connect(port)
    finally:
        squatter.close()
    assert f"127.0.0.1:{port} could not prove it holds this job's token" in str(err.value)
    assert "squatting" in str(err.value)


def test_a_squatter_receives_neither_the_token_nor_anything_that_lets_it_join():
    port, real_port = free_ports(2)
    squatter = Squatter(port)
    try:
        with pytest.raises(CommError):
            _connect(port)
    finally:
        squatter.close()
    got = bytes(squatter.received)
    assert TOKEN.encode() not in got and len(got) == rendezvous._HELLO.size  # no proof sent
    # replaying what it captured to a real listener of the job does not get it accepted
    listener = rendezvous.Listener(Endpoint("127.0.0.1", real_port), KEY, 0,
                                   handshake_seconds=2.0)
    try:
        with socket.create_connection(("127.0.0.1", real_port), timeout=5) as replay:
            replay.sendall(got)
            replay.recv(rendezvous._CHALLENGE.size)
            replay.sendall(os.urandom(32))      # it has no proof to give
            assert replay.recv(16) == b""        # closed, no ACCEPT
        with pytest.raises(CommError, match="did not connect"):
            listener.accept(0, rendezvous.KIND_RING, 1, Deadline(0.5), CTX)
    finally:
        listener.close()


def test_a_handshake_relayed_to_another_ranks_listener_is_refused():
    """The MACs cover the endpoint dialed: a squatter cannot borrow another rank's proof."""
    port, real_port = free_ports(2)
    listener = rendezvous.Listener(Endpoint("127.0.0.1", real_port), KEY, 0,
                                   handshake_seconds=2.0)
    squatter = Squatter(port, relay_to=real_port)
    try:
        with pytest.raises(CommError, match="could not prove it holds this job's token"):
            _connect(port)
    finally:
        squatter.close()
        listener.close()


def test_a_rank_of_another_job_is_told_so_at_once():
    port, = free_ports(1)
    listener = rendezvous.Listener(Endpoint("127.0.0.1", port), KEY, 0)
    try:
        started = time.monotonic()
        with pytest.raises(CommError, match="belongs to another job"):
            _connect(port, seconds=30, key=rendezvous.JobKey("job2", TOKEN))
        assert time.monotonic() - started < 5
    finally:
        listener.close()


def test_the_right_key_joins_and_the_token_never_crosses_the_wire():
    port, = free_ports(1)
    listener = rendezvous.Listener(Endpoint("127.0.0.1", port), KEY, 0)
    try:
        sock, pid = _connect(port)
        got, their_pid = listener.accept(0, rendezvous.KIND_RING, 1, Deadline(5), CTX)
        assert pid == their_pid == os.getpid()
        sock.sendall(b"data")
        assert got.recv(4) == b"data"
        sock.close()
        got.close()
    finally:
        listener.close()


# a listener under abuse, in a process of its own with a lowered open-file limit ---------------
class ListenerHost:
    def __init__(self, port: int, headroom: int, handshake_s: float) -> None:
        self.port = port
        env = {**os.environ, "RINGFLOW_JOB_ID": JOB, "RINGFLOW_JOB_TOKEN": TOKEN,
               "PYTHONPATH": os.pathsep.join(p for p in (
                   str(Path(rendezvous.__file__).parents[3]), os.environ.get("PYTHONPATH"))
                   if p)}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS / "listener_host.py"), str(port), str(headroom),
             str(handshake_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env)
        self.baseline = int(self._answer("ready"))

    def _answer(self, word: str) -> str:
        line = self.proc.stdout.readline().split()
        assert line and line[0] == word, (line, self.proc.stderr.read() if not line else "")
        return line[1] if len(line) > 1 else ""

    def ask(self, command: str, answer: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer(answer)

    def joins(self, rank: int, seconds: float) -> bool:
        """A legitimate rank dials; True when the listener hands its connection over."""
        self.proc.stdin.write(f"accept 0 {rendezvous.KIND_RING} {rank} {seconds}\n")
        self.proc.stdin.flush()
        sock, _ = _connect(self.port, seconds, rank=rank)
        sock.close()
        return self.proc.stdout.readline().startswith("accepted")

    def threads_settle(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            count = int(self.ask("threads", "threads"))
            if count <= self.baseline or time.monotonic() > deadline:
                return count
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def listener_host():
    hosts = []

    def start(headroom: int, handshake_s: float) -> ListenerHost:
        port, = free_ports(1)
        host = ListenerHost(port, headroom, handshake_s)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.close()


@pytest.mark.multiproc
def test_a_connection_flood_past_the_fd_limit_does_not_kill_the_listener(listener_host):
    # 3 spare descriptors: the 4th connection in a handshake meets EMFILE in accept()
    host = listener_host(headroom=3, handshake_s=1.0)
    with ExitStack() as flood:
        for _ in range(100):   # within the backlog (128), far past the 3 spare descriptors
            s = flood.enter_context(socket.socket())
            s.connect(("127.0.0.1", host.port))
        time.sleep(1.0)        # accept() meets EMFILE meanwhile
    assert host.joins(rank=1, seconds=20)
    assert host.threads_settle(timeout=10) <= host.baseline


@pytest.mark.multiproc
def test_idle_slow_and_garbage_clients_leave_room_for_a_real_rank(listener_host):
    host = listener_host(headroom=400, handshake_s=3.0)
    with ExitStack() as abuse:
        for _ in range(300):   # idle: connect and say nothing
            s = abuse.enter_context(socket.socket())
            s.connect(("127.0.0.1", host.port))
        time.sleep(0.5)
        # handshakes in progress are capped (8 here): 300 idle clients hold no 300 threads
        assert int(host.ask("threads", "threads")) <= host.baseline + 8
        slow = abuse.enter_context(socket.create_connection(("127.0.0.1", host.port)))
        stop = threading.Event()

        def drip() -> None:    # one byte a second
            for byte in rendezvous._HELLO.pack(b"RFL2", 1, 0, 1, 1, KEY.digest, bytes(16)):
                if stop.wait(1.0):
                    return
                try:
                    slow.send(bytes([byte]))
                except OSError:
                    return

        threading.Thread(target=drip, daemon=True).start()
        for _ in range(20):    # garbage frames
            g = abuse.enter_context(socket.create_connection(("127.0.0.1", host.port)))
            g.sendall(secrets.token_bytes(200))
        assert host.joins(rank=1, seconds=30)
        stop.set()
    assert host.joins(rank=2, seconds=10)
    assert host.threads_settle(timeout=10) <= host.baseline
