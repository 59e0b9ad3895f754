"""Where a ring's ranks sit: each endpoint's IP address, and the ring order, host-major, so
that only the hops between hosts cross the network."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from ringflow.distributed.env import Endpoint


def ring_order(endpoints: Sequence[Endpoint], ips: Sequence[str]) -> list[int]:
    """Ranks host-major: grouped by IP in order of first appearance, rank order inside, so
    only host-boundary hops cross the network."""
    hosts: list[str] = []
    for ip in ips:
        if ip not in hosts:
            hosts.append(ip)
    return sorted(range(len(endpoints)), key=lambda r: (hosts.index(ips[r]), r))


def resolve(ep: Endpoint) -> str:
    try:
        return socket.gethostbyname(ep.host)
    except OSError:
        return ep.host
