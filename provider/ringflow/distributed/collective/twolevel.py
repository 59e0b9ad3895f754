"""The two-level collectives of a ring that spans hosts with several ranks on each (NCCL's
and Horovod's hierarchical all-reduce): a reduce-scatter among the L ranks of a host through
shared memory, then an all-reduce of each rank's chunk over TCP with the ranks at the same
local position on the other hosts, then an all-gather on the host again. A host sends
2(H-1)/H of the buffer across (H hosts), split over L connections; the flat ring sends
2(n-1)/n of it over one (1.5x for 2 hosts x 2 ranks), every step waiting for the slowest hop.

Every rank ends with identical bytes: each chunk is reduced on a host by one rank in a fixed
order, across hosts by the ring's fixed order, and copied from there.

The halves of sharding (``reduce_scatter_v``, ``all_gather_v``: position p = h*L + l owns
``chunks[p]``, any sizes) go the same two ways. Reduce-scatter: on each host, local position
l reduces the host's share of every chunk owned by a rank at local position l (one
shared-memory pass over all n chunks, chunk p going to local position p % L), then the ranks
at local position l reduce-scatter those H chunks over their TCP ring. All-gather is the
reverse: the TCP ring first, then the same pass on the host. A host sends (H-1)/H of the
buffer across, over L connections at once; the flat ring sends (n-1)/n of it over one. Parts
too uneven for a ring (``ring.lopsided``) take the all-reduce instead, in both algorithms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ringflow.distributed.collective import ring
from ringflow.distributed.collective.intrahost import IntraHost
from ringflow.distributed.collective.transport.base import Deadline, Link

Ufunc = Callable[..., np.ndarray]


@dataclass(frozen=True)
class Layout:
    """Where a rank sits in a host-major ring of `hosts` x `per_host` positions."""

    hosts: int
    per_host: int
    host: int   # this rank's host index (in ring order)
    local: int  # this rank's position among its host's ranks

    def local_positions(self) -> list[int]:
        return [self.host * self.per_host + i for i in range(self.per_host)]

    def cross_positions(self) -> list[int]:
        """Ring positions of the ranks at this local position, one per host."""
        return [h * self.per_host + self.local for h in range(self.hosts)]


def layout_for(ips_in_ring_order: Sequence[str], pos: int) -> Layout | None:
    """The two-level layout, or None when the ring is not at least 2 hosts that each hold
    the same number (at least 2) of contiguous positions."""
    hosts: list[str] = []
    for ip in ips_in_ring_order:
        if not hosts or hosts[-1] != ip:
            if ip in hosts:
                return None  # a host's ranks are not contiguous
            hosts.append(ip)
    n = len(ips_in_ring_order)
    if len(hosts) < 2 or n % len(hosts) or n // len(hosts) < 2:
        return None
    per_host = n // len(hosts)
    if any(ips_in_ring_order[p] != hosts[p // per_host] for p in range(n)):
        return None
    return Layout(len(hosts), per_host, pos // per_host, pos % per_host)


class TwoLevel:
    """all_reduce over `local` (this host's ranks, shared memory) and `cross` (a TCP ring of
    the ranks at this local position, one per host); the other collectives go around
    `flat`, the communicator's host-major ring."""

    name = "two-level"

    def __init__(self, layout: Layout, local: IntraHost, cross: Link, tcp_small_bytes: int,
                 segment_bytes: int, flat: ring.RingAlgorithm) -> None:
        self.flat = flat
        self.all_gather = flat.all_gather
        self.broadcast = flat.broadcast
        self.layout = layout
        self.local = local  # its segments belong to the communicator, which closes them
        self.cross = cross
        self.tcp_small_bytes = tcp_small_bytes
        self.segment_bytes = segment_bytes
        # the ring of the ranks at this local position, one per host (position = host index)
        self.cross_ring = ring.RingAlgorithm(cross, layout.host, layout.hosts, segment_bytes,
                                             tcp_small_bytes)

    def all_reduce(self, buf: np.ndarray, ufunc: Ufunc, deadline: Deadline) -> None:
        """In-place all-reduce of the 1-D contiguous `buf`."""
        lay = self.layout
        if buf.nbytes <= self.tcp_small_bytes:
            # latency-bound: the host's sum on every local rank, then one exchange of whole
            # buffers across (the same host sums, in the same order, in every cross ring)
            self.local.all_reduce(buf, ufunc, deadline)
            ring.ring_all_reduce_small(buf, ufunc, self.cross, lay.host, lay.hosts, deadline)
            return
        self.local.reduce_scatter(buf, ufunc, deadline)
        a, b = ring.split(buf.size, lay.per_host)[lay.local]
        part = buf[a:b]
        if part.size:  # the ranks at this local position all hold a chunk of this size
            plan = ring.ring_plan(part.size, lay.hosts, part.itemsize, self.segment_bytes)
            ring.ring_all_reduce(part, ufunc, self.cross, lay.host, lay.hosts, plan, deadline)
        self.local.all_gather_chunks(buf, deadline)

    def reduce_scatter_v(self, buf: np.ndarray, chunks, ufunc: Ufunc,
                         deadline: Deadline) -> None:
        """Afterwards ``buf[chunks[pos]]`` holds the reduction over every rank (``chunks``
        by ring position, host-major); latency-bound sizes go around the flat ring."""
        if buf.nbytes <= self.tcp_small_bytes:
            self.flat.reduce_scatter_v(buf, chunks, ufunc, deadline)
            return
        if ring.lopsided(chunks, buf.size):
            self.all_reduce(buf, ufunc, deadline)
            return
        self.local.reduce_scatter_v(buf, chunks, ufunc, deadline)
        self.cross_ring.reduce_scatter_v(buf, self._cross_chunks(chunks), ufunc, deadline)

    def all_gather_v(self, buf: np.ndarray, chunks, deadline: Deadline) -> None:
        """Afterwards ``buf[chunks[p]]`` is position p's for every p."""
        if buf.nbytes <= self.tcp_small_bytes:
            self.flat.all_gather_v(buf, chunks, deadline)
            return
        if ring.lopsided(chunks, buf.size):
            own = chunks[self.layout.host * self.layout.per_host + self.layout.local]
            ring.gather_by_all_reduce(self.all_reduce, buf, own, deadline)
            return
        self.cross_ring.all_gather_v(buf, self._cross_chunks(chunks), deadline)
        self.local.all_gather_v(buf, chunks, deadline)

    def _cross_chunks(self, chunks) -> list[tuple[int, int]]:
        """The chunks of the ranks at this local position, by host."""
        return [chunks[p] for p in self.layout.cross_positions()]

    def close(self, goodbye: bool = True) -> None:
        self.cross.close(goodbye=goodbye)
