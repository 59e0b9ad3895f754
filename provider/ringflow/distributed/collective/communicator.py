"""A ring's communicator: what `get_ring(ring_id)` returns to the program ops and what the
Python API's groups wrap. It connects its ranks (rendezvous), picks its algorithm once
(``self.algorithm``, one file each: intrahost.py's shared-memory slots when every rank is on
this host, twolevel.py's two-level all-reduce for hosts with several ranks each, else
ring.py's ring in host-major order) and runs the collectives on numpy arrays with it.
"""

from __future__ import annotations

import itertools
import os
import time
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
    global_ranks,
    rank_names,
)
from ringflow.distributed.collective.wiring import SUPPORTED, Wiring
from ringflow.distributed.env import CommSettings, Endpoint, parse_endpoint, world_endpoints
from ringflow.errors import CommError, ConfigError, ExecutionError


class Communicator(Wiring):
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
        world = _world_endpoints()
        self.ctx = OpContext(rank, ring_id, "init", host=str(eps[rank]),
                             names=rank_names(ring_id, eps, world),
                             global_ranks=global_ranks(eps, world))
        self._job_id = job_id
        self._key = rendezvous.JobKey(job_id, token)
        self._link: Link | None = None
        self._local: IntraHost | None = None
        self.algorithm: IntraHost | twolevel.TwoLevel | ring.RingAlgorithm | None = None
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

    # -- error handling --------------------------------------------------------------------
    def _guarded(self, op: str, fn, *args):
        if self._broken:
            raise CommError(f"rank {self.rank}: ring {self.ring_id} is unusable after an "
                            f"earlier failure: {self._broken}")
        self.ctx.op = op
        began = time.perf_counter()
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
        finally:
            if op != "init":
                _in_collectives[0] += time.perf_counter() - began

    def _deadline(self) -> Deadline:
        return Deadline(self.settings.comm_timeout)

    # -- collectives -------------------------------------------------------------------------
    def all_reduce(self, arr: np.ndarray, op: int = ReduceOp.SUM) -> np.ndarray:
        """Reduce `arr` over the ring in place; every rank ends with identical bytes."""
        if self._shared and type(arr) is np.ndarray and arr.nbytes > self._fast_bytes \
                and op != ReduceOp.AVG:  # (the size first: no address lookup on small ones)
            arrays = self._shared_arrays(arr)
            if arrays is not None:
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
            self._guarded("all_reduce", self.algorithm.all_reduce, work.reshape(-1), ufunc,
                          self._deadline())
        if op == ReduceOp.AVG:
            np.true_divide(work, self.nranks, out=work)
        return _write_back(arr, work)

    def _shared_arrays(self, arr: np.ndarray) -> list[np.ndarray] | None:
        """Every position's array when `arr` is this rank's ``shared_array`` or a leading
        part of it (every rank passes the same part)."""
        arrays = self._shared.get(arr.ctypes.data)
        if arrays is not None and arrays[self.pos].nbytes >= arr.nbytes \
                and arr.dtype == arrays[self.pos].dtype and arr.dtype in _FAST_DTYPES \
                and arr.ndim == 1 and arr.flags.c_contiguous:
            return arrays if arrays[self.pos].size == arr.size else [
                a[:arr.size] for a in arrays]
        return None

    def _fast_all_reduce(self, local: IntraHost, flat: np.ndarray, ufunc) -> None:
        """The latency path among the ranks of one host (what ``_guarded`` does, inline)."""
        self.ctx.op = "all_reduce"
        try:
            local.fast_all_reduce(flat, ufunc, self._deadline)
        except CommError as exc:
            self._broken = str(exc)
            self.close(goodbye=False)
            raise

    def broadcast(self, arr: np.ndarray, root: int) -> np.ndarray:
        """Copy rank `root`'s `arr` into every rank's `arr` (in place)."""
        self._check_rank(root, "broadcast root")
        work = _working(arr, "broadcast", widen=False)
        if self.nranks > 1 and work.size:
            self._guarded("broadcast", self.algorithm.broadcast, work.reshape(-1),
                          self.order.index(root), self._deadline())
        return _write_back(arr, work)

    def all_gather(self, arr: np.ndarray) -> list[np.ndarray]:
        """Every rank's `arr`, in rank order (new arrays)."""
        work = _working(arr, "all_gather", widen=False)
        out = np.empty((self.nranks, work.size), dtype=work.dtype)
        out[self.pos] = work.reshape(-1)
        if self.nranks > 1 and work.size:
            self._guarded("all_gather", self.algorithm.all_gather, work.reshape(-1), out,
                          self._deadline())
        by_rank = [out[self.order.index(r)].reshape(arr.shape) for r in range(self.nranks)]
        return [a.astype(arr.dtype, copy=False) for a in by_rank]

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
        wide = np.float32 if out.dtype == np.float16 else out.dtype
        work = np.stack([np.asarray(a, dtype=wide).reshape(-1) for a in inputs])
        bounds = [r * out.size for r in range(self.nranks + 1)]
        self.reduce_scatter_v(work.reshape(-1), bounds, op)
        out[...] = work[self.rank].reshape(out.shape)
        return out

    def reduce_scatter_v(self, arr: np.ndarray, bounds: Sequence[int],
                         op: int = ReduceOp.SUM) -> np.ndarray:
        """In place on the flat `arr`: rank r's part ``[bounds[r], bounds[r+1])`` ends
        holding the reduction over every rank (the other parts hold partial results).
        ``bounds`` has nranks + 1 non-decreasing offsets from 0 to arr.size, the same on
        every rank; parts may be empty and of any size (sharding's shards)."""
        chunks = self._chunks(arr, bounds, "reduce_scatter_v")
        ufunc = ufunc_for(op, arr.dtype)
        arrays = self._shared_arrays(arr) if self._shared and type(arr) is np.ndarray else None
        if arrays is not None:
            self._guarded("reduce_scatter_v", self._local.reduce_scatter_in_place, arrays,
                          chunks, ufunc, self._deadline())
            work = arr
        else:
            work = _working(arr, "reduce_scatter_v")
            if self.nranks > 1 and work.size:
                self._guarded("reduce_scatter_v", self.algorithm.reduce_scatter_v,
                              work.reshape(-1), chunks, ufunc, self._deadline())
        if op == ReduceOp.AVG:
            a, b = bounds[self.rank], bounds[self.rank + 1]
            np.true_divide(work[a:b], self.nranks, out=work[a:b])
        return _write_back(arr, work)

    def all_gather_v(self, arr: np.ndarray, bounds: Sequence[int]) -> np.ndarray:
        """In place on the flat `arr`: afterwards every rank's ``[bounds[r], bounds[r+1])``
        is rank r's (the counterpart of ``reduce_scatter_v``)."""
        chunks = self._chunks(arr, bounds, "all_gather_v")
        arrays = self._shared_arrays(arr) if self._shared and type(arr) is np.ndarray else None
        if arrays is not None:
            self._guarded("all_gather_v", self._local.all_gather_in_place, arrays, chunks,
                          self._deadline())
            return arr
        work = _working(arr, "all_gather_v", widen=False)
        if self.nranks > 1 and work.size:
            self._guarded("all_gather_v", self.algorithm.all_gather_v, work.reshape(-1),
                          chunks, self._deadline())
        return _write_back(arr, work)

    def _chunks(self, arr: np.ndarray, bounds: Sequence[int], op: str) -> list[tuple[int, int]]:
        """The parts of ``bounds`` by ring position, checked."""
        b = [int(x) for x in bounds]
        if not isinstance(arr, np.ndarray) or arr.ndim != 1:
            raise ExecutionError(f"{op} on ring {self.ring_id}: expected a 1-D numpy array, "
                                 f"got {getattr(arr, 'shape', type(arr).__name__)}")
        if len(b) != self.nranks + 1 or b[0] != 0 or b[-1] != arr.size or any(
                x > y for x, y in itertools.pairwise(b)):
            raise ExecutionError(f"{op} on ring {self.ring_id}: bounds must be "
                                 f"{self.nranks + 1} non-decreasing offsets from 0 to "
                                 f"{arr.size}, got {b}")
        return [(b[r], b[r + 1]) for r in self.order]

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
        if self.algorithm is not None:
            # kept (closed): a later call must reach _guarded, which names the failure
            self.algorithm.close(goodbye=goodbye)
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
                f"transport={self.transport!r}, algorithm={self.algorithm_name!r})")

    @property
    def two_level(self) -> bool:
        """Whether all-reduces go in two levels (hosts x ranks per host, twolevel.py)."""
        return isinstance(self.algorithm, twolevel.TwoLevel)

    @property
    def algorithm_name(self) -> str:
        """"shm", "ring" or "two-level" ("" for a ring of one)."""
        return getattr(self.algorithm, "name", "")


_in_collectives = [0.0]


def collective_seconds() -> float:
    """Seconds this process has spent in collectives (every ring), mostly waiting for its
    peers: a rank's step time less this is its own work."""
    return _in_collectives[0]


def _world_endpoints() -> tuple[Endpoint, ...] | None:
    """The job's endpoints by global rank, when the launcher's env says them (errors name
    global ranks by them); None for rings made by hand."""
    try:
        return world_endpoints(os.environ)
    except ConfigError:
        return None


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
