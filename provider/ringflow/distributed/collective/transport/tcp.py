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
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

import numpy as np

from ringflow.distributed.collective.transport.base import Deadline, OpContext


def byte_view(arr: np.ndarray) -> memoryview:
    return memoryview(arr).cast("B") if arr.size else memoryview(b"")


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
        # a hop to a rank of this host goes through shared memory (transport.shm.Channel);
        # the socket then only carries heartbeats
        self.send_channel = None
        self.recv_channel = None
        self._stop = threading.Event()
        self._hb_timeout = heartbeat_timeout
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
                    self.left.send(b"h", socket.MSG_DONTWAIT)
                next_beat = now + interval
            try:
                readable, _, _ = select.select([self.right], [], [], interval / 2)
                if readable:
                    if not self.right.recv(4096, socket.MSG_DONTWAIT):
                        return self._fail(self.right_rank, f"rank {self.right_rank} closed its "
                                          "connection (process exited or was killed)")
                    last_seen = time.monotonic()
            except (BlockingIOError, InterruptedError):
                pass
            except (OSError, ValueError) as exc:
                if not self._stop.is_set():
                    self._fail(self.right_rank, f"connection to rank {self.right_rank} "
                               f"broke: {exc}")
                return None
            if self._stop.is_set():
                return None
            if time.monotonic() - last_seen > self._hb_timeout:
                return self._fail(self.right_rank, f"no heartbeat from rank {self.right_rank} "
                                  f"for {self._hb_timeout:g} s (RINGFLOW_HEARTBEAT_TIMEOUT): "
                                  "process stopped or host unreachable")
            deadline = self._deadline
            if deadline is not None and deadline.expired():
                return self._fail(self.left_rank, f"no progress for {deadline.seconds:g} s "
                                  f"(RINGFLOW_COMM_TIMEOUT) waiting for rank {self.left_rank} "
                                  f"(or sending to rank {self.right_rank})", timeout=True)
        return None

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
        if self.send_channel is not None:
            self.send_channel.send(data, deadline)
            return
        self._deadline = deadline
        try:
            self.right.sendall(data)
        except OSError as exc:
            self.check()
            raise self.ctx.error(self.right_rank, f"sending to rank {self.right_rank} "
                                 f"failed: {exc.strerror or exc}") from None
        finally:
            self._deadline = None

    def recv_into(self, view: memoryview, deadline: Deadline) -> None:
        """Fill `view` from the left neighbour."""
        if self.recv_channel is not None:
            self.recv_channel.recv_into(view, deadline)
            return
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
                    raise self.ctx.error(self.left_rank, f"rank {self.left_rank} closed its "
                                         "connection (process exited or was killed)")
                got += n
        finally:
            self._deadline = None

    def close(self) -> None:
        self._stop.set()
        self._shutdown()
        for s in (self.right, self.left):
            s.close()
        if self._hb is not threading.current_thread():
            self._hb.join(timeout=5)
