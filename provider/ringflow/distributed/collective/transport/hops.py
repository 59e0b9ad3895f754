"""A ring link whose two directions each go over TCP or through shared memory: in a ring that
spans hosts, the hop to a neighbour of the same host is a ``shm.Channel`` and the one to a
neighbour elsewhere the ``TcpLink``'s socket. The TcpLink stays underneath either way: its
sockets carry the heartbeats and its watchdog sees a neighbour die, so ``check`` and
``close`` are always its own."""

from __future__ import annotations

from ringflow.distributed.collective.transport.base import Deadline
from ringflow.distributed.collective.transport.shm import Channel
from ringflow.distributed.collective.transport.tcp import TcpLink


class HopLink:
    """A ``Link``: send to the right over ``send_channel`` or TCP, receive from the left
    over ``recv_channel`` or TCP."""

    def __init__(self, tcp: TcpLink, send_channel: Channel | None = None,
                 recv_channel: Channel | None = None) -> None:
        self.tcp = tcp
        self._send = send_channel.send if send_channel is not None else tcp.send
        self._recv = recv_channel.recv_into if recv_channel is not None else tcp.recv_into

    def send(self, data: memoryview, deadline: Deadline) -> None:
        self._send(data, deadline)

    def recv_into(self, view: memoryview, deadline: Deadline) -> None:
        self._recv(view, deadline)

    def check(self) -> None:
        self.tcp.check()

    def close(self, goodbye: bool = True) -> None:
        self.tcp.close(goodbye=goodbye)
