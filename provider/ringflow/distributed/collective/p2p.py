"""Point-to-point messages of a ring (``send``/``recv``): one socket per (direction, peer),
dialled or accepted through the rendezvous on first use (kind P2P), a header with the byte
count and dtype before the bytes, so a mismatch is named instead of misread."""

from __future__ import annotations

import socket
import struct

import numpy as np

from ringflow.distributed.collective import rendezvous
from ringflow.distributed.collective.transport.base import Deadline, OpContext, byte_view
from ringflow.distributed.env import CommSettings, Endpoint

_HEADER = struct.Struct("!q8s")


class PointToPoint:
    """The send/recv sockets of one rank of ring `ring_id`."""

    def __init__(self, ring_id: int, rank: int, endpoints: list[Endpoint],
                 key: rendezvous.JobKey, settings: CommSettings, ctx: OpContext) -> None:
        self.ring_id, self.rank, self.endpoints = ring_id, rank, endpoints
        self.key, self.settings, self.ctx = key, settings, ctx
        self._socks: dict[tuple[str, int], socket.socket] = {}

    def send(self, work: np.ndarray, dst: int) -> None:
        sock = self._socks.get(("to", dst))
        if sock is None:
            deadline = Deadline(self.settings.rendezvous_timeout)
            sock, _ = rendezvous.connect(self.endpoints[dst], self.key, rendezvous.KIND_P2P,
                                         self.ring_id, self.rank, dst, deadline, self.ctx)
            sock.settimeout(self.settings.comm_timeout)
            self._socks[("to", dst)] = sock
        try:
            sock.sendall(_HEADER.pack(work.nbytes, work.dtype.str.encode()))
            sock.sendall(byte_view(work.reshape(-1)))
        except OSError as exc:
            raise self.ctx.error(dst, f"sending to {self.ctx.name(dst)} failed: {exc}") from None

    def recv(self, work: np.ndarray, src: int) -> None:
        sock = self._socks.get(("from", src))
        if sock is None:
            listener = rendezvous.listener_for(self.endpoints[self.rank], self.key, self.rank)
            sock, _ = listener.accept(self.ring_id, rendezvous.KIND_P2P, src,
                                      Deadline(self.settings.rendezvous_timeout), self.ctx)
            sock.settimeout(self.settings.comm_timeout)
            self._socks[("from", src)] = sock
        try:
            nbytes, dt = _HEADER.unpack(rendezvous.recv_exact(sock, _HEADER.size))
            if nbytes != work.nbytes or dt.rstrip(b"\0") != work.dtype.str.encode():
                raise self.ctx.error(src, f"{self.ctx.name(src)} sent {nbytes} bytes of "
                                     f"{dt.decode()!r}, "
                                     f"expected {work.nbytes} bytes of {work.dtype.str!r}")
            view, got = byte_view(work.reshape(-1)), 0
            while got < len(view):
                n = sock.recv_into(view[got:])
                if n == 0:
                    raise ConnectionError(f"{self.ctx.name(src)} closed the connection")
                got += n
        except (OSError, ConnectionError) as exc:
            raise self.ctx.error(src, f"receiving from {self.ctx.name(src)} failed: "
                                 f"{exc}") from None

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
