"""TCP transport: a rank's link to its ring neighbours. Data flows left -> right; the reverse
direction of the same sockets carries heartbeat bytes (right -> left), so a silent or dead
right neighbour is noticed even while nobody sends data.

Sockets block (the kernel waits, the GIL is released, recv_into fills numpy buffers with
MSG_WAITALL), and the algorithms alternate send(segment) / recv_into(segment): at the start of
every step the socket buffers are empty and at most two segments are in flight per direction,
which the 4 MiB buffers always hold, so a send never waits for the peer (no deadlock) and the
peer's next segment arrives while this rank reduces the last one. The heartbeat thread is also
the watchdog: on a dead or silent peer or a passed deadline it shuts the sockets down, which
wakes the blocked caller with the recorded cause.

Orderly close: a rank that finishes sends GOODBYE on the heartbeat direction before closing, so
its left neighbour treats the EOF that follows as "left in order", not as a death; only a later
send to that rank fails (naming that it left early). A failing rank closes without goodbye.
"""

from __future__ import annotations

import contextlib
import fcntl
import select
import socket
import struct
import termios
import threading
import time

from ringflow.distributed.collective.transport.base import Deadline, OpContext

HEARTBEAT, GOODBYE = b"h", b"G"
# how long an orderly close waits for the right neighbour's kernel to acknowledge our last data
# (closing earlier risks a reset that discards it); a live peer's kernel acks in microseconds
_LINGER = 2.0


class TcpLink:
    """send() to the right neighbour, recv_into() from the left one, with deadlines."""

    def __init__(self, right: socket.socket, left: socket.socket, right_rank: int,
                 left_rank: int, ctx: OpContext, heartbeat_timeout: float) -> None:
        self.right, self.left = right, left
        self.right_rank, self.left_rank = right_rank, left_rank
        self.ctx = ctx
        self._failure: str | None = None
        self._failed_peer: int | None = None
        self._timed_out = False
        self._deadline: Deadline | None = None  # of the send/recv in progress, if any
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()  # close() wakes the watchdog's select
        self.right_left_in_order = False  # the right neighbour said GOODBYE
        self._right_readable = select.poll()  # is a heartbeat or GOODBYE waiting? (send)
        self._right_readable.register(right, select.POLLIN)
        self._hb_timeout = heartbeat_timeout
        self.sent_bytes = 0  # data sent to the right (not heartbeats): which path a collective took
        for s in (right, left):
            s.setblocking(True)
        self._hb = threading.Thread(target=self._watch, daemon=True,
                                    name=f"ringflow-heartbeat-ring{ctx.ring_id}")
        self._hb.start()

    # -- heartbeat and watchdog (own thread) -----------------------------------------------
    def _watch(self) -> None:
        interval = min(2.0, self._hb_timeout / 5)
        last_seen = time.monotonic()
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                # a full buffer or a dead left neighbour shows up on the data path instead
                with contextlib.suppress(OSError):
                    self.left.send(HEARTBEAT, socket.MSG_DONTWAIT)
                next_beat = now + interval
            watched = [self._wake_r] + ([] if self.right_left_in_order else [self.right])
            try:
                readable, _, _ = select.select(watched, [], [], interval / 2)
                if self.right in readable and not self._read_right():
                    return None
                last_seen = time.monotonic() if self.right in readable else last_seen
            except (BlockingIOError, InterruptedError):
                pass
            except (OSError, ValueError) as exc:
                if not self._stop.is_set() and not self.right_left_in_order:
                    self._fail(self.right_rank, f"connection to {self.ctx.name(self.right_rank)} "
                               f"broke: {exc}")
                if not self.right_left_in_order:
                    return None
            if self._stop.is_set():
                return None
            if (not self.right_left_in_order
                    and time.monotonic() - last_seen > self._hb_timeout):
                return self._fail(self.right_rank, "no heartbeat from "
                                  f"{self.ctx.name(self.right_rank)} for {self._hb_timeout:g} s "
                                  "(RINGFLOW_HEARTBEAT_TIMEOUT): "
                                  "process stopped or host unreachable")
            deadline = self._deadline
            if deadline is not None and deadline.expired():
                return self._fail(self.left_rank, f"no progress for {deadline.seconds:g} s "
                                  "(RINGFLOW_COMM_TIMEOUT) waiting for "
                                  f"{self.ctx.name(self.left_rank)} "
                                  f"(or sending to {self.ctx.name(self.right_rank)})", timeout=True)
        return None

    def _read_right(self) -> bool:
        """Consume heartbeats from the right neighbour; False once the watchdog must stop.
        EOF after GOODBYE is an orderly exit: nothing to watch there any more."""
        data = self.right.recv(4096, socket.MSG_DONTWAIT)
        if GOODBYE in data:
            self.right_left_in_order = True
            return True
        if data:
            return True
        if self.right_left_in_order:
            return True
        self._fail(self.right_rank, f"{self.ctx.name(self.right_rank)} closed its connection "
                   "(process exited or was killed)")
        return False

    def _fail(self, peer: int | None, cause: str, timeout: bool = False) -> None:
        if self._failure is None:
            self._failed_peer, self._failure, self._timed_out = peer, cause, timeout
            self._shutdown()  # wakes a caller blocked in send/recv

    def _shutdown(self) -> None:
        for s in (self.right, self.left):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def check(self) -> None:
        """Raise CommError if the watchdog saw a peer die, go quiet, or the deadline pass."""
        if self._failure is not None:
            raise self.ctx.error(self._failed_peer, self._failure, timeout=self._timed_out)

    # -- data path (caller's thread) ---------------------------------------------------------
    def send(self, data: memoryview, deadline: Deadline) -> None:
        self._deadline = deadline
        try:
            if self.right_left_in_order or self._goodbye_waiting():
                raise BrokenPipeError("it had left")
            self.right.sendall(data)
            self.sent_bytes += data.nbytes
        except OSError as exc:
            self.check()
            if self.right_left_in_order:
                raise self.ctx.error(self.right_rank, self._left_early()) from None
            raise self.ctx.error(self.right_rank, f"sending to {self.ctx.name(self.right_rank)} "
                                 f"failed: {exc.strerror or exc}") from None
        finally:
            self._deadline = None

    def _goodbye_waiting(self) -> bool:
        """Whether the right neighbour's GOODBYE already sits in this socket, unread by the
        watchdog thread yet: a send now would be buffered by the kernel and lost without an
        error. A zero-timeout poll per send (no exception on the common path), a peek only
        when the right neighbour has sent something."""
        if not self._right_readable.poll(0):
            return False
        try:
            pending = self.right.recv(4096, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False  # the send itself reports a broken connection
        if GOODBYE in pending:
            self.right_left_in_order = True
        return self.right_left_in_order

    def _left_early(self) -> str:
        return (f"{self.ctx.name(self.right_rank)} left early: it finished, said goodbye and "
                "closed its connection, but this rank still has data to send to it (did every "
                "rank run the same collectives?)")

    def recv_into(self, view: memoryview, deadline: Deadline) -> None:
        """Fill `view` from the left neighbour."""
        self._deadline = deadline
        got, total = 0, len(view)
        try:
            while got < total:
                try:
                    n = self.left.recv_into(view[got:], total - got, socket.MSG_WAITALL)
                except InterruptedError:
                    continue
                except OSError as exc:
                    self.check()
                    cause = exc.strerror or exc
                    raise self.ctx.error(self.left_rank, f"receiving from rank "
                                         f"{self.left_rank} failed: {cause}") from None
                if n == 0:
                    self.check()
                    raise self.ctx.error(self.left_rank, f"{self.ctx.name(self.left_rank)} "
                                         "closed its connection (process exited or was killed, or "
                                         "it finished before sending this data)")
                got += n
        finally:
            self._deadline = None

    def close(self, goodbye: bool = True) -> None:
        """Orderly (goodbye=True, after the last op): tell the left neighbour we leave in order,
        let the right one's kernel take all our data, then close. Without goodbye (after a
        failure) the sockets just close, so the neighbours fail fast."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._hb is not threading.current_thread():
            self._hb.join(timeout=5)
        if goodbye and self._failure is None:
            self._say_goodbye()
        self._shutdown()
        for s in (self.right, self.left, self._wake_r, self._wake_w):
            s.close()

    def _say_goodbye(self) -> None:
        with contextlib.suppress(OSError):
            self.left.send(GOODBYE, socket.MSG_DONTWAIT)
            self.left.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            self.right.shutdown(socket.SHUT_WR)  # FIN after the last data
        # Closing a socket with unread input sends a reset, and a reset discards what the
        # kernel still holds unsent: drain heartbeats until our data is acknowledged.
        until = time.monotonic() + _LINGER
        while time.monotonic() < until:
            _drain(self.right)
            _drain(self.left)
            if _unacked(self.right) <= 0:
                break
            time.sleep(0.001)
        _drain(self.right)
        _drain(self.left)


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while sock.recv(65536, socket.MSG_DONTWAIT):
            pass


def _unacked(sock: socket.socket) -> int:
    """Bytes sent but not yet acknowledged by the peer's kernel (SIOCOUTQ)."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4)
    except OSError:
        return 0
    return struct.unpack("i", buf)[0]
