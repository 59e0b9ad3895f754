"""TCP transport: a rank's link to its ring neighbours. Data flows left -> right; the reverse
direction of the same sockets carries heartbeat bytes (right -> left), so a silent or dead
right neighbour is noticed even while nobody sends data.

Sockets are non-blocking and driven by poll(): a pending send makes progress while a receive
waits, so every rank can send to the right and receive from the left at once (no deadlock),
and data go from the kernel straight into numpy buffers (recv_into a memoryview).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

import numpy as np

from ringflow.distributed.collective.transport.base import Deadline, OpContext

_POLL_MS = 200
_EVENTS_ERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


def byte_view(arr: np.ndarray) -> memoryview:
    return memoryview(arr).cast("B") if arr.size else memoryview(b"")


class TcpLink:
    """send() to the right neighbour, recv_into() from the left one, with deadlines."""

    def __init__(self, right: socket.socket, left: socket.socket, right_rank: int,
                 left_rank: int, ctx: OpContext, heartbeat_timeout: float) -> None:
        self.right, self.left = right, left
        self.right_rank, self.left_rank = right_rank, left_rank
        self.ctx = ctx
        self._pending = memoryview(b"")
        self._failure: str | None = None
        self._failed_peer: int | None = None
        self._stop = threading.Event()
        self._hb_timeout = heartbeat_timeout
        for s in (right, left):
            s.setblocking(False)
        self._hb = threading.Thread(target=self._heartbeat, daemon=True,
                                    name=f"ringflow-heartbeat-ring{ctx.ring_id}")
        self._hb.start()

    # -- heartbeat (own thread) ------------------------------------------------------------
    def _heartbeat(self) -> None:
        interval = min(2.0, self._hb_timeout / 5)
        last_seen = time.monotonic()
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                try:
                    self.left.send(b"h")
                except BlockingIOError:
                    pass
                except OSError:
                    pass  # the left neighbour's failure shows up on the data path
                next_beat = now + interval
            try:
                readable, _, _ = select.select([self.right], [], [], interval / 2)
                if readable:
                    if not self.right.recv(4096):
                        self._fail(self.right_rank, f"rank {self.right_rank} closed its "
                                   "connection (process exited or was killed)")
                        return
                    last_seen = time.monotonic()
            except (BlockingIOError, InterruptedError):
                pass
            except (OSError, ValueError) as exc:
                if not self._stop.is_set():
                    self._fail(self.right_rank, f"connection to rank {self.right_rank} "
                               f"broke: {exc}")
                return
            if time.monotonic() - last_seen > self._hb_timeout:
                self._fail(self.right_rank, f"no heartbeat from rank {self.right_rank} for "
                           f"{self._hb_timeout:g} s (RINGFLOW_HEARTBEAT_TIMEOUT): process "
                           "stopped or host unreachable")
                return

    def _fail(self, peer: int, cause: str) -> None:
        if self._failure is None:
            self._failed_peer, self._failure = peer, cause

    def check(self) -> None:
        """Raise CommError if the heartbeat thread saw the right neighbour die or go quiet."""
        if self._failure is not None:
            raise self.ctx.error(self._failed_peer, self._failure)

    # -- data path (caller's thread) ---------------------------------------------------------
    def begin_send(self, data: memoryview) -> None:
        assert not self._pending, "previous send not finished"
        self._pending = data

    def _push(self) -> None:
        try:
            sent = self.right.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise self.ctx.error(self.right_rank, f"sending to rank {self.right_rank} "
                                 f"failed: {exc.strerror or exc}") from None
        self._pending = self._pending[sent:]

    def _wait(self, want_read: bool, deadline: Deadline, what: str) -> bool:
        """Block until a socket is ready; True when the left socket is readable."""
        fds = select.poll()
        if want_read:
            fds.register(self.left.fileno(), select.POLLIN)
        if self._pending:
            fds.register(self.right.fileno(), select.POLLOUT)
        events = fds.poll(max(0, min(_POLL_MS, int(deadline.remaining() * 1000) + 1)))
        if not events:
            self.check()
            if deadline.expired():
                peer = self.left_rank if want_read else self.right_rank
                raise self.ctx.error(peer, f"no progress for {deadline.seconds:g} s "
                                     f"(RINGFLOW_COMM_TIMEOUT) {what}", timeout=True)
        readable = False
        for fd, ev in events:
            if fd == self.right.fileno():
                if ev & _EVENTS_ERR:
                    raise self.ctx.error(self.right_rank, f"connection to rank "
                                         f"{self.right_rank} broke (peer died?)")
                self._push()
            else:
                readable = True
        return readable

    def recv_into(self, view: memoryview, deadline: Deadline) -> None:
        """Fill `view` from the left neighbour, pushing any pending send meanwhile."""
        got, total = 0, len(view)
        while got < total:
            if self._pending:
                self._push()
            try:
                n = self.left.recv_into(view[got:])
            except (BlockingIOError, InterruptedError):
                self._wait(True, deadline, f"for data from rank {self.left_rank}")
                continue
            except OSError as exc:
                raise self.ctx.error(self.left_rank, f"receiving from rank {self.left_rank} "
                                     f"failed: {exc.strerror or exc}") from None
            if n == 0:
                raise self.ctx.error(self.left_rank, f"rank {self.left_rank} closed its "
                                     "connection (process exited or was killed)")
            got += n

    def finish_send(self, deadline: Deadline) -> None:
        while self._pending:
            self._push()
            if self._pending:
                self._wait(False, deadline, f"sending to rank {self.right_rank}")

    def close(self) -> None:
        self._stop.set()
        for s in (self.right, self.left):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        if self._hb is not threading.current_thread():
            self._hb.join(timeout=5)
