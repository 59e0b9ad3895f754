"""A ring's communicator: what `get_ring(ring_id)` returns to the program ops and what the
Python API's groups wrap. It connects its ranks (rendezvous), picks the algorithm (shared-memory
slots when every rank is on this host, else the TCP ring in host-major order) and runs the
collectives on numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ringflow.distributed.collective import rendezvous, ring, twolevel
from ringflow.distributed.collective.intrahost import IntraHost
from ringflow.distributed.collective.p2p import PointToPoint
from ringflow.distributed.collective.placement import resolve, ring_order
from ringflow.distributed.collective.reduce_op import ReduceOp, ufunc_for
from ringflow.distributed.collective.transport import shm
from ringflow.distributed.collective.transport.base import (
    Deadline,
    Link,
    OpContext,
    note_local_ranks,
)
from ringflow.distributed.collective.transport.hops import HopLink
from ringflow.distributed.collective.transport.tcp import TcpLink
from ringflow.distributed.env import CommSettings, Endpoint, parse_endpoint
from ringflow.errors import CommError, ExecutionError

SUPPORTED = {np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64")}


class Communicator:
    """Collectives among `nranks` processes; `rank` is this process's index in `endpoints`."""

    def __init__(self, ring_id: int, endpoints: Sequence[str | Endpoint], rank: int,
                 nranks: int, job_id: str, token: str, settings: CommSettings) -> None:
        eps = [e if isinstance(e, Endpoint) else parse_endpoint(e, "endpoints") for e in endpoints]
        if len(eps) != nranks or not 0 <= rank < nranks:
            raise CommError(f"ring {ring_id}: rank {rank} of nranks {nranks} does not fit "
                            f"{len(eps)} endpoints")
        self.ring_id, self.rank, self.nranks = ring_id, rank, nranks
        self.endpoints = eps
        self.settings = settings
        self.ctx = OpContext(rank, ring_id, "init", host=str(eps[rank]))
        self._job_id = job_id
        self._key = rendezvous.JobKey(job_id, token)
        self._link: Link | None = None
        self._local: IntraHost | None = None
        self._two_level: twolevel.TwoLevel | None = None
        self._fast_bytes = 0  # all-reduces up to this size take the one-host latency path
        self._segments: list[shm.Segment] = []
        # shared_array: data address of this rank's array -> every position's array
        self._shared: dict[int, list[np.ndarray]] = {}
        self._goodbye_words: list[tuple[memoryview, int]] = []  # set on an orderly close
        self._p2p = PointToPoint(ring_id, rank, eps, self._key, settings, self.ctx)
        self._broken: str | None = None
        ips = [resolve(e) for e in eps]
        self.order = ring_order(eps, ips)
        self.pos = self.order.index(rank)
        self._ips = ips
        self.transport = "shm" if (settings.transport != "tcp" and len(set(ips)) == 1) else "tcp"
        if nranks > 1:
            self._guarded("init", self._connect)

    # -- setup -----------------------------------------------------------------------------
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
        elif self.settings.transport != "tcp":
            self._map_channels(right, rpid, left, lpid)
            layout = twolevel.layout_for([self._ips[r] for r in self.order], self.pos)
            if layout is not None and self.settings.two_level:
                self._two_level = self._connect_two_level(layout, deadline)

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

    def _connect_two_level(self, lay: twolevel.Layout, deadline: Deadline) -> twolevel.TwoLevel:
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
        flat = self._link

        def check() -> None:
            flat.check()
            link.check()
            watch.check()

        local = IntraHost(segs, lay.local, host_ranks, self.ctx, check,
                          self.settings.one_round_bytes(lay.per_host))
        return twolevel.TwoLevel(lay, local, link, self.settings.tcp_small_bytes,
                                 self.settings.segment_bytes)

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

    # -- error handling --------------------------------------------------------------------
    def _guarded(self, op: str, fn, *args):
        if self._broken:
            raise CommError(f"rank {self.rank}: ring {self.ring_id} is unusable after an "
                            f"earlier failure: {self._broken}")
        self.ctx.op = op
        try:
            return fn(*args)
        except CommError as exc:
            self._broken = str(exc)
            self.close(goodbye=False)  # peers see our sockets close and fail fast too
            raise
        except Exception:
            # A local error (bad input) leaves peers mid-collective: fail them fast too.
            if op != "init" and self.nranks > 1:
                self._broken = f"{op} raised on rank {self.rank}"
                self.close(goodbye=False)
            raise

    def _deadline(self) -> Deadline:
        return Deadline(self.settings.comm_timeout)

    # -- collectives -------------------------------------------------------------------------
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

    def all_reduce(self, arr: np.ndarray, op: int = ReduceOp.SUM) -> np.ndarray:
        """Reduce `arr` over the ring in place; every rank ends with identical bytes."""
        if self._shared and type(arr) is np.ndarray and arr.nbytes > self._fast_bytes \
                and op != ReduceOp.AVG:  # (the size first: no address lookup on small ones)
            arrays = self._shared.get(arr.ctypes.data)
            if arrays is not None and arrays[self.pos].nbytes == arr.nbytes \
                    and arr.dtype == arrays[self.pos].dtype and arr.dtype in _FAST_DTYPES:
                self._guarded("all_reduce", self._local.all_reduce_in_place, arrays,
                              ufunc_for(op, arr.dtype), self._deadline())
                return arr
        local = self._local
        if (local is not None and type(arr) is np.ndarray and arr.dtype in _FAST_DTYPES
                and arr.flags.c_contiguous and 0 < arr.nbytes <= self._fast_bytes
                and op != ReduceOp.AVG and self._broken is None):
            self._fast_all_reduce(local, arr if arr.ndim == 1 else arr.reshape(-1),
                                  ufunc_for(op, arr.dtype))
            return arr
        work = _working(arr, "all_reduce")
        ufunc = ufunc_for(op, arr.dtype)
        if self.nranks > 1 and work.size:
            self._guarded("all_reduce", self._all_reduce, work.reshape(-1), ufunc)
        if op == ReduceOp.AVG:
            np.true_divide(work, self.nranks, out=work)
        return _write_back(arr, work)

    def _fast_all_reduce(self, local: IntraHost, flat: np.ndarray, ufunc) -> None:
        """The latency path among the ranks of one host (what ``_guarded`` does, inline)."""
        self.ctx.op = "all_reduce"
        try:
            local.fast_all_reduce(flat, ufunc, self._deadline)
        except CommError as exc:
            self._broken = str(exc)
            self.close(goodbye=False)
            raise

    def _all_reduce(self, flat: np.ndarray, ufunc) -> None:
        if self._two_level is not None:
            self._two_level.all_reduce(flat, ufunc, self._deadline())
            return
        if self._local is not None:
            self._local.all_reduce(flat, ufunc, self._deadline())
            return
        if flat.nbytes <= self.settings.tcp_small_bytes:
            ring.ring_all_reduce_small(flat, ufunc, self._link, self.pos, self.nranks,
                                       self._deadline())
            return
        plan = ring.ring_plan(flat.size, self.nranks, flat.itemsize, self.settings.segment_bytes)
        ring.ring_all_reduce(flat, ufunc, self._link, self.pos, self.nranks, plan,
                             self._deadline())

    def broadcast(self, arr: np.ndarray, root: int) -> np.ndarray:
        """Copy rank `root`'s `arr` into every rank's `arr` (in place)."""
        self._check_rank(root, "broadcast root")
        work = _working(arr, "broadcast", widen=False)
        if self.nranks > 1 and work.size:
            self._guarded("broadcast", self._broadcast, work.reshape(-1), self.order.index(root))
        return _write_back(arr, work)

    def _broadcast(self, flat: np.ndarray, root_pos: int) -> None:
        if self._local is not None:
            self._local.broadcast(flat, root_pos, self._deadline())
        else:
            ring.ring_broadcast(flat, self._link, self.pos, root_pos, self.nranks,
                                self.settings.segment_bytes, self._deadline())

    def all_gather(self, arr: np.ndarray) -> list[np.ndarray]:
        """Every rank's `arr`, in rank order (new arrays)."""
        work = _working(arr, "all_gather", widen=False)
        out = np.empty((self.nranks, work.size), dtype=work.dtype)
        out[self.pos] = work.reshape(-1)
        if self.nranks > 1 and work.size:
            self._guarded("all_gather", self._all_gather, work.reshape(-1), out)
        by_rank = [out[self.order.index(r)].reshape(arr.shape) for r in range(self.nranks)]
        return [a.astype(arr.dtype, copy=False) for a in by_rank]

    def _all_gather(self, flat: np.ndarray, out: np.ndarray) -> None:
        if self._local is not None:
            self._local.all_gather(flat, out, self._deadline())
            return
        ring.ring_all_gather(out, self._link, self.pos, self.nranks, self.settings.segment_bytes,
                             self._deadline())

    def reduce(self, arr: np.ndarray, root: int, op: int = ReduceOp.SUM) -> np.ndarray:
        """Rank `root` gets the reduction in `arr`; the others keep their input."""
        self._check_rank(root, "reduce root")
        result = self.all_reduce(arr.copy(), op)
        if self.rank == root:
            arr[...] = result
        return arr

    def reduce_scatter(self, out: np.ndarray, inputs: Sequence[np.ndarray],
                       op: int = ReduceOp.SUM) -> np.ndarray:
        """out = the reduction over ranks of each rank's inputs[my rank]; each rank moves only
        the reduce-scatter half of an all-reduce."""
        if len(inputs) != self.nranks or any(np.shape(a) != out.shape for a in inputs):
            raise ExecutionError(f"reduce_scatter on ring {self.ring_id}: expected "
                                 f"{self.nranks} input arrays of shape {out.shape}, got "
                                 f"{[np.shape(a) for a in inputs]}")
        ufunc = ufunc_for(op, out.dtype)
        wide = np.float32 if out.dtype == np.float16 else out.dtype
        # chunk c of the working buffer is the block that the rank finishing chunk c wants
        owner = [self.order[(c - self._rs_shift()) % self.nranks] for c in range(self.nranks)]
        work = np.stack([np.asarray(inputs[r], dtype=wide).reshape(-1) for r in owner])
        if self.nranks > 1 and out.size:
            self._guarded("reduce_scatter", self._reduce_scatter, work.reshape(-1), ufunc)
        mine = work[owner.index(self.rank)]
        if op == ReduceOp.AVG:
            np.true_divide(mine, self.nranks, out=mine)
        out[...] = mine.reshape(out.shape)
        return out

    def _rs_shift(self) -> int:
        # the ring leaves chunk pos+1 at position pos; the shared-memory rounds leave chunk pos
        return 0 if self._local is not None or self.nranks == 1 else 1

    def _reduce_scatter(self, flat: np.ndarray, ufunc) -> None:
        if self._local is not None:
            self._local.reduce_scatter(flat, ufunc, self._deadline())
            return
        plan = ring.ring_plan(flat.size, self.nranks, flat.itemsize, self.settings.segment_bytes)
        ring.ring_reduce_scatter(flat, ufunc, self._link, self.pos, self.nranks, plan,
                                 self._deadline())

    def barrier(self) -> None:
        if self.nranks > 1:
            self.all_reduce(np.zeros(self.nranks, dtype=np.int32))

    # -- point to point ------------------------------------------------------------------------
    def send(self, arr: np.ndarray, dst: int) -> None:
        self._check_rank(dst, "send destination")
        self._guarded("send", self._p2p.send, _working(arr, "send", widen=False), dst)

    def recv(self, arr: np.ndarray, src: int) -> np.ndarray:
        self._check_rank(src, "recv source")
        work = _working(arr, "recv", widen=False)
        self._guarded("recv", self._p2p.recv, work, src)
        return _write_back(arr, work)

    # -- teardown ------------------------------------------------------------------------------
    def _check_rank(self, r: int, what: str) -> None:
        if not 0 <= r < self.nranks:
            raise ExecutionError(f"ring {self.ring_id}: {what} {r} is not a rank in "
                                 f"0..{self.nranks - 1}")

    def close(self, goodbye: bool = True) -> None:
        """goodbye: an orderly exit that neighbours still finishing their last op must not
        take for a failure; False after a failure, so they fail fast."""
        goodbye = goodbye and self._broken is None
        if goodbye:
            for words, index in self._goodbye_words:
                words[index] = 1
        self._goodbye_words = []
        if self._two_level is not None:
            self._two_level.close(goodbye=goodbye)
            self._two_level = None
        if self._link is not None:
            self._link.close(goodbye=goodbye)
            self._link = None
        self._local = None
        self._shared.clear()
        for seg in self._segments:
            seg.close()
        self._segments = []
        self._p2p.close()
        rendezvous.drop_ring(self.ring_id)

    def __repr__(self) -> str:
        return (f"Communicator(ring_id={self.ring_id}, rank={self.rank}, nranks={self.nranks}, "
                f"transport={self.transport!r}, two_level={self.two_level})")

    @property
    def two_level(self) -> bool:
        """Whether all-reduces go in two levels (hosts x ranks per host, twolevel.py)."""
        return self._two_level is not None


# dtypes the one-host latency path reduces as they are (float16 is widened, elsewhere)
_FAST_DTYPES = frozenset(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))


def _working(arr: np.ndarray, op: str, widen: bool = True) -> np.ndarray:
    """A contiguous array the algorithms can work on: `arr` itself when possible; float16 is
    widened to float32 for reductions (accumulate in float32)."""
    if not isinstance(arr, np.ndarray):
        raise ExecutionError(f"{op}: expected a numpy array, got {type(arr).__name__}")
    if arr.dtype not in SUPPORTED:
        raise ExecutionError(f"{op}: dtype {arr.dtype} is not supported; expected one of "
                             "float16, float32, float64, int32, int64")
    if widen and arr.dtype == np.float16:
        return arr.astype(np.float32)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _write_back(arr: np.ndarray, work: np.ndarray) -> np.ndarray:
    if work is not arr:
        arr[...] = work
    return arr
