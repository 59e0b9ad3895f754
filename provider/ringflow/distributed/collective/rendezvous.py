"""Rendezvous: one TCP listener per process accepts every ring's connections and routes each
by the (ring id, kind, rank) its handshake names; `connect` dials a peer with retries.

Handshake, a mutual challenge-response keyed by the job token (the token never crosses the
wire, and nothing either side sends can be replayed):

    client -> server  HELLO     magic, kind, ring, rank, pid, job digest, client nonce
    server -> client  CHALLENGE magic, pid, server nonce, MAC("server", ...)
    client -> server  PROOF     MAC("client", ...)
    server -> client  ACCEPT    magic

Both MACs are HMAC-SHA256(token, label | job digest | endpoint dialed | kind | ring | rank |
client nonce | server nonce): the server proves it holds the token before the client proves
anything, so a process squatting a rank's port learns nothing that lets it join, and the
endpoint in the MAC keeps a squatter from relaying the handshake to another rank's listener.
A connection for another job gets `NOT_THIS_JOB`, one over the cap of concurrent handshakes
`BUSY` (the client retries); garbage, a wrong proof or a handshake slower than its deadline is
closed and logged (never with the token).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
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

_HELLO = struct.Struct("!4sBiii8s16s")
_CHALLENGE = struct.Struct("!4si16s32s")
_PROOF = struct.Struct("!32s")
_MAGIC = b"RFL2"
ACCEPT = b"RFOK"
NOT_THIS_JOB = b"RFNJ"
BUSY = b"RFBZ"
KIND_RING = 1  # a rank's data connection to its right neighbour in a ring
KIND_P2P = 2  # send/recv from one rank to another
KIND_CROSS = 3  # a two-level ring's link to the same local position on the next host
SOCKET_BUFFER = 4 << 20
HANDSHAKE_SECONDS = 10.0  # the whole server side of one handshake
MAX_HANDSHAKES = 32  # handshakes in progress at once; more are told BUSY


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


def recv_exact(sock: socket.socket, n: int, deadline: Deadline | None = None) -> bytes:
    """n bytes; with a deadline, the whole read must finish before it."""
    data = bytearray()
    while len(data) < n:
        if deadline is not None:
            left = deadline.remaining()
            if left <= 0:
                raise TimeoutError(f"read {len(data)} of {n} bytes within the deadline")
            sock.settimeout(left)
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("connection closed during the handshake")
        data += part
    return bytes(data)


class JobKey:
    """The job's identity in handshakes: its id (public) and token (secret, never sent)."""

    def __init__(self, job_id: str, token: str) -> None:
        self.digest = hashlib.sha256(job_id.encode()).digest()[:8]
        self._token = token.encode()

    def mac(self, label: bytes, endpoint: Endpoint, kind: int, ring: int, rank: int,
            client_nonce: bytes, server_nonce: bytes) -> bytes:
        msg = b"|".join((b"ringflow/" + label, self.digest, str(endpoint).encode(),
                         struct.pack("!Bii", kind, ring, rank), client_nonce, server_nonce))
        return hmac.new(self._token, msg, hashlib.sha256).digest()

    def tag(self, label: bytes, *parts: str) -> str:
        """A short name part nobody without the token can compute (shared-memory names)."""
        msg = b"|".join((b"ringflow/" + label, self.digest, *(p.encode() for p in parts)))
        return hmac.new(self._token, msg, hashlib.sha256).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"JobKey(digest={self.digest.hex()})"


class Listener:
    """Accepts connections for every ring of this process on its endpoint."""

    def __init__(self, endpoint: Endpoint, key: JobKey, rank: int,
                 handshake_seconds: float = HANDSHAKE_SECONDS,
                 max_handshakes: int = MAX_HANDSHAKES) -> None:
        self.endpoint = endpoint
        self._key = key
        self._rank = rank
        self._arrived: dict[tuple[int, int, int], tuple[socket.socket, int]] = {}
        self._cond = threading.Condition()
        self._handshake_seconds = handshake_seconds
        self._max_handshakes = max_handshakes
        self._slots = threading.BoundedSemaphore(max_handshakes)
        self._closed = False
        self._last_warning = 0.0
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

    def _warn(self, message: str, *args) -> None:
        # a flood must not flood the log as well: one warning a second at most
        now = time.monotonic()
        if now - self._last_warning >= 1.0:
            self._last_warning = now
            log.warning("[rank %d] " + message, self._rank, *args)

    def _accept_loop(self) -> None:
        backoff = 0.01
        while not self._closed:
            try:
                conn, addr = self._sock.accept()
            except OSError as exc:
                if self._closed:
                    return
                # EMFILE/ENFILE/ENOBUFS under a connection flood: wait and try again
                self._warn("listener on %s: accept failed (%s); retrying", self.endpoint,
                           exc.strerror or exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.01
            if not self._slots.acquire(blocking=False):
                self._refuse(conn, BUSY)
                self._warn("listener on %s: %d handshakes in progress; told %s:%d to retry",
                           self.endpoint, self._max_handshakes, addr[0], addr[1])
                continue
            threading.Thread(target=self._handshake_in_slot, args=(conn, addr), daemon=True,
                             name="ringflow-handshake").start()

    @staticmethod
    def _refuse(conn: socket.socket, answer: bytes) -> None:
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(answer)
        conn.close()

    def _handshake_in_slot(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        try:
            self._handshake(conn, addr)
        finally:
            self._slots.release()

    def _handshake(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        deadline = Deadline(self._handshake_seconds)
        peer = f"{addr[0]}:{addr[1]}"
        try:
            magic, kind, ring, rank, pid, digest, client_nonce = _HELLO.unpack(
                recv_exact(conn, _HELLO.size, deadline))
            if magic != _MAGIC:
                raise ValueError("not a ringflow handshake")
            if not hmac.compare_digest(digest, self._key.digest):
                self._refuse(conn, NOT_THIS_JOB)
                self._warn("refused a connection from %s: it belongs to another job", peer)
                return
            server_nonce = os.urandom(16)
            mine = self._key.mac(b"server", self.endpoint, kind, ring, rank, client_nonce,
                                 server_nonce)
            conn.sendall(_CHALLENGE.pack(_MAGIC, os.getpid(), server_nonce, mine))
            proof, = _PROOF.unpack(recv_exact(conn, _PROOF.size, deadline))
            expected = self._key.mac(b"client", self.endpoint, kind, ring, rank, client_nonce,
                                     server_nonce)
            if not hmac.compare_digest(proof, expected):
                raise ValueError(f"claims ring {ring} rank {rank} without proof of the job "
                                 f"token")
            conn.sendall(ACCEPT)
            conn.settimeout(None)
        except (OSError, ValueError, struct.error, ConnectionError) as exc:
            conn.close()
            self._warn("refused a connection from %s: %s", peer, exc)
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
                    raise ctx.error(rank, f"{ctx.name(rank)} did not connect to {self.endpoint} "
                                    "within "
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


class _Retry(Exception):
    """The listener was not ready (refused, busy): dial again until the deadline."""


def connect(endpoint: Endpoint, key: JobKey, kind: int, ring: int, rank: int, peer: int,
            deadline: Deadline, ctx: OpContext) -> tuple[socket.socket, int]:
    """Dial `peer` at `endpoint` until it answers or the deadline passes; returns the
    connected socket and the peer's pid. A peer that cannot prove it holds the job token
    fails the call at once, naming the endpoint."""
    nap = 0.02
    last = "no attempt"
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tune(sock)
        try:
            sock.settimeout(max(0.05, min(deadline.remaining(), 10.0)))
            sock.connect((endpoint.host, endpoint.port))
            return _client_handshake(sock, endpoint, key, kind, ring, rank, peer, deadline,
                                     ctx)
        except _Retry as exc:
            sock.close()
            last = str(exc)
        except OSError as exc:
            sock.close()
            last = exc.strerror or str(exc)
        except BaseException:
            sock.close()  # a refused proof (CommError) must not leak the socket
            raise
        if deadline.expired():
            raise ctx.error(peer, f"could not connect to {endpoint} within {deadline.seconds:g} s"
                            f" (RINGFLOW_RENDEZVOUS_TIMEOUT); last error: {last}", timeout=True)
        time.sleep(min(nap, max(deadline.remaining(), 0)))
        nap = min(nap * 2, 0.5)


def _client_handshake(sock: socket.socket, endpoint: Endpoint, key: JobKey, kind: int,
                      ring: int, rank: int, peer: int, deadline: Deadline,
                      ctx: OpContext) -> tuple[socket.socket, int]:
    client_nonce = os.urandom(16)
    try:
        sock.sendall(_HELLO.pack(_MAGIC, kind, ring, rank, os.getpid(), key.digest,
                                 client_nonce))
        head = recv_exact(sock, 4, deadline)
        if head == BUSY:
            raise _Retry(f"{endpoint} is busy with other handshakes")
        if head == NOT_THIS_JOB:
            raise ctx.error(peer, f"{endpoint} belongs to another job (RINGFLOW_JOB_ID "
                            f"differs): it is not {ctx.name(peer)} of this job")
        if head != _MAGIC:
            raise ctx.error(peer, f"{endpoint} is not a ringflow rank (bad handshake reply)")
        pid, server_nonce, theirs = struct.unpack(
            "!i16s32s", recv_exact(sock, _CHALLENGE.size - 4, deadline))
        expected = key.mac(b"server", endpoint, kind, ring, rank, client_nonce, server_nonce)
        if not hmac.compare_digest(theirs, expected):
            raise ctx.error(peer, f"{endpoint} could not prove it holds this job's token: it "
                            f"is not {ctx.name(peer)} of this job (another job's rank, or a "
                            f"process squatting the port; RINGFLOW_JOB_TOKEN differs)")
        sock.sendall(_PROOF.pack(key.mac(b"client", endpoint, kind, ring, rank, client_nonce,
                                         server_nonce)))
        if recv_exact(sock, len(ACCEPT), deadline) != ACCEPT:
            raise ctx.error(peer, f"{endpoint} refused this rank's proof of the job token")
    except (ConnectionError, TimeoutError) as exc:
        raise _Retry(f"{endpoint} closed the handshake ({exc})") from None
    sock.settimeout(None)
    return sock, pid


_listener: Listener | None = None
_listener_lock = threading.Lock()


def listener_for(endpoint: Endpoint, key: JobKey, rank: int) -> Listener:
    """This process's one listener, created on first use on `endpoint`."""
    global _listener
    with _listener_lock:
        if _listener is None:
            _listener = Listener(endpoint, key, rank)
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
