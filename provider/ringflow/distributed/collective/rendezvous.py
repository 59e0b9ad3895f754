"""Rendezvous: one TCP listener per process accepts every ring's connections and routes each
by the (ring id, kind, rank) its handshake names; `connect` dials a peer with retries.

Handshake (client -> server): magic, kind, ring id, rank, pid, token length, token.
Reply (server -> client): magic, pid. A wrong token gets no reply: the connection is closed
and one line is logged (without the token).
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import os
import socket
import struct
import threading
import time

from ringflow.distributed.collective.transport.base import Deadline, OpContext
from ringflow.distributed.env import Endpoint
from ringflow.errors import CommError

log = logging.getLogger("ringflow.distributed")

_HELLO = struct.Struct("!4sBiiiH")
_REPLY = struct.Struct("!4si")
_MAGIC = b"RFL1"
KIND_RING = 1  # a rank's data connection to its right neighbour in a ring
KIND_P2P = 2  # send/recv from one rank to another
SOCKET_BUFFER = 4 << 20


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("connection closed during the handshake")
        data += part
    return data


class Listener:
    """Accepts connections for every ring of this process on its endpoint."""

    def __init__(self, endpoint: Endpoint, token: str, rank: int) -> None:
        self.endpoint = endpoint
        self._token = token.encode()
        self._rank = rank
        self._arrived: dict[tuple[int, int, int], tuple[socket.socket, int]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._sock = self._bind(endpoint)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"ringflow-listener-{endpoint}")
        self._thread.start()

    def _bind(self, endpoint: Endpoint) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tune(sock)  # buffer sizes are inherited by accepted sockets (window scaling)
        try:
            sock.bind((endpoint.host, endpoint.port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            cause = "address already in use" if exc.errno == errno.EADDRINUSE else str(exc)
            raise CommError(f"rank {self._rank}: cannot listen on {endpoint}: {cause} "
                            f"(PADDLE_TRAINER_ENDPOINTS gives this rank {endpoint})") from exc
        return sock

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handshake, args=(conn, addr), daemon=True).start()

    def _handshake(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        try:
            conn.settimeout(10.0)
            magic, kind, ring, rank, pid, tlen = _HELLO.unpack(recv_exact(conn, _HELLO.size))
            token = recv_exact(conn, tlen) if magic == _MAGIC else b""
            if magic != _MAGIC or not hmac.compare_digest(token, self._token):
                log.warning("[rank %d] rejected a connection from %s:%d claiming ring %d rank %d:"
                            " %s", self._rank, addr[0], addr[1], ring, rank,
                            "wrong job token" if magic == _MAGIC else "not a ringflow handshake")
                conn.close()
                return
            conn.sendall(_REPLY.pack(_MAGIC, os.getpid()))
            conn.settimeout(None)
        except (OSError, struct.error, ConnectionError):
            conn.close()
            return
        with self._cond:
            old = self._arrived.pop((ring, kind, rank), None)
            if old is not None:
                old[0].close()  # a retry replaced an earlier connection
            self._arrived[(ring, kind, rank)] = (conn, pid)
            self._cond.notify_all()

    def accept(self, ring: int, kind: int, rank: int, deadline: Deadline,
               ctx: OpContext) -> tuple[socket.socket, int]:
        """The connection rank `rank` opened to us for (ring, kind), and its pid."""
        with self._cond:
            while (ring, kind, rank) not in self._arrived:
                left = deadline.remaining()
                if left <= 0:
                    raise ctx.error(rank, f"rank {rank} did not connect to {self.endpoint} within "
                                    f"{deadline.seconds:g} s (RINGFLOW_RENDEZVOUS_TIMEOUT)",
                                    timeout=True)
                self._cond.wait(min(left, 1.0))
            return self._arrived.pop((ring, kind, rank))

    def drop_ring(self, ring: int) -> None:
        with self._cond:
            for key in [k for k in self._arrived if k[0] == ring]:
                self._arrived.pop(key)[0].close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._cond:
            for conn, _ in self._arrived.values():
                conn.close()
            self._arrived.clear()


def connect(endpoint: Endpoint, token: str, kind: int, ring: int, rank: int, peer: int,
            deadline: Deadline, ctx: OpContext) -> tuple[socket.socket, int]:
    """Dial `peer` at `endpoint` until it answers or the deadline passes; returns the
    connected socket and the peer's pid."""
    hello = _HELLO.pack(_MAGIC, kind, ring, rank, os.getpid(), len(token.encode()))
    hello += token.encode()
    nap = 0.02
    last = "no attempt"
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tune(sock)
        try:
            sock.settimeout(max(0.05, min(deadline.remaining(), 10.0)))
            sock.connect((endpoint.host, endpoint.port))
        except OSError as exc:
            sock.close()
            last = exc.strerror or str(exc)
        else:
            return _finish_handshake(sock, hello, endpoint, peer, ctx)
        if deadline.expired():
            raise ctx.error(peer, f"could not connect to {endpoint} within {deadline.seconds:g} s"
                            f" (RINGFLOW_RENDEZVOUS_TIMEOUT); last error: {last}", timeout=True)
        time.sleep(min(nap, max(deadline.remaining(), 0)))
        nap = min(nap * 2, 0.5)


def _finish_handshake(sock: socket.socket, hello: bytes, endpoint: Endpoint, peer: int,
                      ctx: OpContext) -> tuple[socket.socket, int]:
    try:
        sock.sendall(hello)
        magic, pid = _REPLY.unpack(recv_exact(sock, _REPLY.size))
    except (OSError, ConnectionError) as exc:
        sock.close()
        raise ctx.error(peer, f"{endpoint} closed the handshake ({exc}); the job tokens "
                        "(RINGFLOW_JOB_TOKEN) or job ids probably differ") from None
    if magic != _MAGIC:
        sock.close()
        raise ctx.error(peer, f"{endpoint} is not a ringflow rank (bad handshake reply)")
    sock.settimeout(None)
    return sock, pid


_listener: Listener | None = None
_listener_lock = threading.Lock()


def listener_for(endpoint: Endpoint, token: str, rank: int) -> Listener:
    """This process's one listener, created on first use on `endpoint`."""
    global _listener
    with _listener_lock:
        if _listener is None:
            _listener = Listener(endpoint, token, rank)
        elif _listener.endpoint != endpoint:
            raise CommError(f"rank {rank}: this process already listens on {_listener.endpoint};"
                            f" a ring cannot give it a second endpoint {endpoint}")
        return _listener


def close_listener() -> None:
    global _listener
    with _listener_lock:
        if _listener is not None:
            _listener.close()
            _listener = None


def drop_ring(ring: int) -> None:
    """Forget connections that arrived for a ring being destroyed."""
    with _listener_lock:
        if _listener is not None:
            _listener.drop_ring(ring)
