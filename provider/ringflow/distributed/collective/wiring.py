"""How a communicator connects its ranks and chooses its algorithm (``Wiring``, the base of
``Communicator``): the TCP ring of the rendezvous, the shared-memory segments of the ranks of
one host, the shared-memory hops of a ring across hosts, the two-level layout; and the
zero-copy arrays (``shared_array``) every rank of one host maps.
"""

from __future__ import annotations

import numpy as np

from ringflow.distributed.collective import rendezvous, ring, twolevel
from ringflow.distributed.collective.intrahost import IntraHost
from ringflow.distributed.collective.transport import shm
from ringflow.distributed.collective.transport.base import Deadline, note_local_ranks
from ringflow.distributed.collective.transport.hops import HopLink
from ringflow.distributed.collective.transport.tcp import TcpLink
from ringflow.errors import ExecutionError

SUPPORTED = {np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64")}


class Wiring:
    """The connection state of a ``Communicator``; the collectives are the subclass's."""

    def _connect(self) -> None:
        n, pos = self.nranks, self.pos
        right, left = self.order[(pos + 1) % n], self.order[(pos - 1) % n]
        deadline = Deadline(self.settings.rendezvous_timeout)
        listener = rendezvous.listener_for(self.endpoints[self.rank], self._key, self.rank)
        rsock, rpid = rendezvous.connect(self.endpoints[right], self._key,
                                         rendezvous.KIND_RING, self.ring_id, self.rank, right,
                                         deadline, self.ctx)
        lsock, lpid = listener.accept(self.ring_id, rendezvous.KIND_RING, left, deadline,
                                      self.ctx)
        self._link = TcpLink(rsock, lsock, right, left, self.ctx, self.settings.heartbeat_timeout)
        note_local_ranks(sum(ip == self._ips[self.rank] for ip in self._ips))
        if self.transport == "shm":
            self._map_segments()
            self.algorithm = self._local
            return
        if self.settings.transport != "tcp":
            self._map_channels(right, rpid, left, lpid)
        self.algorithm = ring.RingAlgorithm(self._link, pos, n, self.settings.segment_bytes,
                                            self.settings.tcp_small_bytes)
        layout = twolevel.layout_for([self._ips[r] for r in self.order], self.pos)
        if self.settings.transport != "tcp" and layout is not None and self.settings.two_level:
            self.algorithm = self._connect_two_level(layout, deadline, self.algorithm)

    def _map_channels(self, right: int, rpid: int, left: int, lpid: int) -> None:
        """Shared-memory hops between neighbours of one host in a ring that spans hosts."""
        here = self._ips[self.rank]
        to_right, from_left = self._ips[right] == here, self._ips[left] == here
        tag = self._shm_tag()
        name = [shm.channel_name(self._job_id, self.ring_id, tag, p) for p in range(self.nranks)]
        own = shm.create_segment(name[self.pos], self.settings.slot_bytes) if from_left else None
        try:
            self._tcp_barrier()  # every channel exists
            peer_seg = shm.open_segment(name[(self.pos + 1) % self.nranks],
                                        self.settings.slot_bytes) if to_right else None
            self._tcp_barrier()  # every channel is mapped by both ends
        finally:
            shm.unlink(name[self.pos])
        tcp = self._link
        assert isinstance(tcp, TcpLink)  # made by _connect just before
        send = recv = None
        if peer_seg is not None:
            self._goodbye_words.append((peer_seg.words, shm.Channel.SENDER_LEFT))
            watch = shm.PeerWatch({right: rpid}, self.ctx, self.settings.heartbeat_timeout,
                                  {right: (peer_seg.words, shm.Channel.RECEIVER_LEFT)})
            send = shm.Channel(peer_seg, right, self.ctx, lambda: (tcp.check(), watch.check()))
            self._segments.append(peer_seg)
        if own is not None:
            self._goodbye_words.append((own.words, shm.Channel.RECEIVER_LEFT))
            watch_l = shm.PeerWatch({left: lpid}, self.ctx, self.settings.heartbeat_timeout,
                                    {left: (own.words, shm.Channel.SENDER_LEFT)})
            recv = shm.Channel(own, left, self.ctx, lambda: (tcp.check(), watch_l.check()))
            self._segments.append(own)
        if to_right or from_left:
            # the hops to this host's neighbours go through shared memory; the TcpLink's
            # sockets then carry only the heartbeats
            self._link = HopLink(tcp, send, recv)
            self.transport = "tcp+shm"

    def _connect_two_level(self, lay: twolevel.Layout, deadline: Deadline,
                           flat: ring.RingAlgorithm) -> twolevel.TwoLevel:
        """Shared memory among this host's ranks, and a TCP ring with the ranks at the same
        local position on the other hosts."""
        host_ranks = [self.order[p] for p in lay.local_positions()]
        tag = self._key.tag(b"shm-host", str(self.ring_id), str(lay.host),
                            *map(str, self.endpoints))
        names = [shm.segment_name(self._job_id, self.ring_id, tag, i)
                 for i in range(lay.per_host)]
        segs = shm.map_group(names, lay.local, self.settings.slot_bytes, self._tcp_barrier)
        self._segments.extend(segs)
        self._goodbye_words.append((segs[lay.local].words, shm.LEFT))
        watch = shm.group_watch(segs, lay.local, host_ranks, self.ctx,
                                self.settings.heartbeat_timeout)
        cross = [self.order[p] for p in lay.cross_positions()]
        right, left = cross[(lay.host + 1) % lay.hosts], cross[(lay.host - 1) % lay.hosts]
        listener = rendezvous.listener_for(self.endpoints[self.rank], self._key, self.rank)
        rsock, _ = rendezvous.connect(self.endpoints[right], self._key, rendezvous.KIND_CROSS,
                                      self.ring_id, self.rank, right, deadline, self.ctx)
        lsock, _ = listener.accept(self.ring_id, rendezvous.KIND_CROSS, left, deadline, self.ctx)
        link = TcpLink(rsock, lsock, right, left, self.ctx, self.settings.heartbeat_timeout)
        flat_link = self._link

        def check() -> None:
            flat_link.check()
            link.check()
            watch.check()

        local = IntraHost(segs, lay.local, host_ranks, self.ctx, check,
                          self.settings.one_round_bytes(lay.per_host))
        return twolevel.TwoLevel(lay, local, link, self.settings.tcp_small_bytes,
                                 self.settings.segment_bytes, flat)

    def _shm_tag(self) -> str:
        # which communicator of the job (ring ids repeat across mp groups), unguessable
        return self._key.tag(b"shm", str(self.ring_id), *map(str, self.endpoints))

    def _map_segments(self) -> None:
        tag = self._shm_tag()
        names = [shm.segment_name(self._job_id, self.ring_id, tag, p) for p in range(self.nranks)]
        segs = shm.map_group(names, self.pos, self.settings.slot_bytes, self._tcp_barrier)
        self._segments = segs
        self._goodbye_words.append((segs[self.pos].words, shm.LEFT))
        watch = shm.group_watch(segs, self.pos, self.order, self.ctx,
                                self.settings.heartbeat_timeout)

        def check() -> None:
            self._link.check()
            watch.check()

        small = self.settings.one_round_bytes(self.nranks)
        self._local = IntraHost(segs, self.pos, self.order, self.ctx, check, small)
        self._fast_bytes = min(small, self.settings.slot_bytes)

    def _tcp_all_agree(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (over the TCP link)."""
        votes = np.zeros(self.nranks, dtype=np.int64)  # one element per chunk, as below
        votes[:] = int(flag)
        plan = ring.ring_plan(votes.size, self.nranks, 8, self.settings.segment_bytes)
        ring.ring_all_reduce(votes, np.minimum, self._link, self.pos, self.nranks, plan,
                             Deadline(self.settings.rendezvous_timeout))
        return bool(votes.min())

    def _tcp_barrier(self) -> None:
        token = np.zeros(self.nranks, dtype=np.int64)  # one element per chunk: n-1 real hops
        plan = ring.ring_plan(token.size, self.nranks, 8, self.settings.segment_bytes)
        ring.ring_all_reduce(token, np.add, self._link, self.pos, self.nranks, plan,
                             Deadline(self.settings.rendezvous_timeout))

    # -- zero-copy arrays ------------------------------------------------------------------
    def shared_array(self, count: int, dtype: str | np.dtype = "float32") -> np.ndarray:
        """A zeroed 1-D array that ``all_reduce`` reduces where it lies: in shared memory
        that every rank of this host maps, so a large all-reduce reads the peers' arrays
        directly instead of staging through the slots (for the executor's gradient buckets
        and benchmarks). Collective: every rank calls it in the same order with the same
        count and dtype. On a ring that is not all on one host, or when /dev/shm lacks the
        room, it is a plain array."""
        dt = np.dtype(dtype)
        if dt not in SUPPORTED or count < 0:
            raise ExecutionError(f"shared_array: expected a count >= 0 and one of the "
                                 f"supported dtypes, got {count} of {dt}")
        if self._local is None or count == 0:
            return np.zeros(count, dtype=dt)
        # every rank must choose alike: shared memory only if /dev/shm has room on all.
        # Agreed (and mapped) over the TCP link, not through the slots, which a bucket's
        # all-reduce on the communication thread may be using meanwhile.
        room = shm.room_for(count * dt.itemsize * self.nranks)
        if not self._guarded("shared_array", self._tcp_all_agree, room):
            return np.zeros(count, dtype=dt)
        return self._guarded("shared_array", self._map_shared, count, dt)

    def _map_shared(self, count: int, dt: np.dtype) -> np.ndarray:
        nbytes = count * dt.itemsize
        tag = self._key.tag(b"shm-array", str(self.ring_id), str(len(self._shared)),
                            *map(str, self.endpoints))
        names = [shm.segment_name(self._job_id, self.ring_id, tag, p) for p in range(self.nranks)]
        half = -(-nbytes // 2)  # a segment's two slots, end to end, hold the array
        segs = shm.map_group(names, self.pos, half + (-half) % 64, self._tcp_barrier)
        self._segments.extend(segs)
        arrays = [seg.data[:nbytes].view(dt) for seg in segs]
        self._shared[arrays[self.pos].ctypes.data] = arrays
        return arrays[self.pos]

