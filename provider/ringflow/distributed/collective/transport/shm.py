"""Shared-memory transport for the ranks of one host: one segment per rank,
/dev/shm/ringflow-<job id>-ring<ring>-<members>-p<position>, holding a header of counters and
two data slots (the intra-host algorithm), or, for a ring hop between two ranks of one host
inside a ring that spans hosts, a `Channel` segment ...-ch<position> owned by the receiving
rank. <members> is a digest of the ring's endpoints: several communicators of one job share a
ring id (every model-parallel group of a tensor-parallel job is ring 0), so the id alone would
make two groups on one host open each other's segments.
Segments are unlinked as soon as every peer has mapped them, so a crash leaks nothing after
setup; an atexit hook unlinks any this process created and still holds a name for.

Synchronisation is by monotonically increasing sequence counters in each header (one writer
each). x86 keeps stores in program order (TSO), so data written before a counter store are
visible to a reader that sees the new counter value.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import mmap
import os
import time

import numpy as np

from ringflow.distributed.collective.transport.base import OpContext, process_state, spin_wait

SHM_DIR = "/dev/shm"
HEADER = 4096
# header words (int64): 0 = sequence counter, 1 = pid, 2 and 3 = op signature per slot;
# LEFT is set by a rank that closes the ring in order (after its last op): gone is then not dead
SEQ, PID, SIG0, LEFT = 0, 1, 2, 4

_created: set[str] = set()


def _unlink_created() -> None:
    for name in list(_created):
        unlink(name)


atexit.register(_unlink_created)


def unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))
    _created.discard(name)


def members_tag(endpoints) -> str:
    """A short digest of a ring's member endpoints (in rank order) for segment names."""
    joined = ",".join(str(e) for e in endpoints).encode()
    return hashlib.blake2s(joined, digest_size=5).hexdigest()


def segment_name(job_id: str, ring_id: int, members: str, pos: int) -> str:
    return f"ringflow-{job_id}-ring{ring_id}-{members}-p{pos}"


def channel_name(job_id: str, ring_id: int, members: str, pos: int) -> str:
    return f"ringflow-{job_id}-ring{ring_id}-{members}-ch{pos}"


class Segment:
    """One mapped segment: `words` (int64 header) and `data` (two slots of bytes)."""

    def __init__(self, mm: mmap.mmap, slot_bytes: int) -> None:
        self.mm = mm
        self.words = memoryview(mm)[:64].cast("q")
        self.data = np.frombuffer(mm, dtype=np.uint8, count=2 * slot_bytes, offset=HEADER)
        self.slot_bytes = slot_bytes

    def slot(self, k: int) -> np.ndarray:
        return self.data[k * self.slot_bytes:(k + 1) * self.slot_bytes]

    def close(self) -> None:
        self.words.release()
        del self.data
        # BufferError: a view is still alive somewhere; the mapping goes with the process
        with contextlib.suppress(BufferError):
            self.mm.close()


def create_segment(name: str, slot_bytes: int) -> Segment:
    path = os.path.join(SHM_DIR, name)
    flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        # left by a crashed earlier incarnation of this ring in this job: never reuse data
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    _created.add(name)
    try:
        os.ftruncate(fd, HEADER + 2 * slot_bytes)
        mm = mmap.mmap(fd, HEADER + 2 * slot_bytes)
    finally:
        os.close(fd)
    seg = Segment(mm, slot_bytes)
    seg.words[PID] = os.getpid()
    return seg


def open_segment(name: str, slot_bytes: int) -> Segment:
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        if os.fstat(fd).st_size != HEADER + 2 * slot_bytes:
            raise ValueError(f"shared-memory segment {name} has size {os.fstat(fd).st_size}, "
                             f"expected {HEADER + 2 * slot_bytes}")
        mm = mmap.mmap(fd, HEADER + 2 * slot_bytes)
    finally:
        os.close(fd)
    return Segment(mm, slot_bytes)


class PeerWatch:
    """Liveness of the local peers by their pid: gone or zombie = dead; stopped (SIGSTOP)
    for longer than the heartbeat timeout = silent."""

    def __init__(self, pids: dict[int, int], ctx: OpContext, stopped_limit: float,
                 left: dict[int, tuple[memoryview, int]] | None = None) -> None:
        self.pids = pids  # rank -> pid
        self.left = left or {}  # rank -> (header words, index) it sets when it leaves in order
        self.ctx = ctx
        self.stopped_limit = stopped_limit
        self._stopped_since: dict[int, float] = {}

    def check(self) -> None:
        now = time.monotonic()
        for rank, pid in self.pids.items():
            words, index = self.left.get(rank, (None, 0))
            if words is not None and words[index]:
                # only reached while a wait is unmet: the departed rank cannot meet it any more
                raise self.ctx.error(rank, f"rank {rank} left early: it finished and closed "
                                     "this ring in order while this rank still waits for it "
                                     "(did every rank run the same collectives?)")
            state = process_state(pid)
            if state is None or state in "ZX":
                raise self.ctx.error(rank, f"rank {rank} (pid {pid}) died")
            if state in "Tt":
                since = self._stopped_since.setdefault(rank, now)
                if now - since > self.stopped_limit:
                    raise self.ctx.error(rank, f"rank {rank} (pid {pid}) has been stopped for "
                                         f"{now - since:.0f} s (RINGFLOW_HEARTBEAT_TIMEOUT)")
            else:
                self._stopped_since.pop(rank, None)


class Channel:
    """A one-way byte stream between two ranks of one host (a ring hop): a ring buffer in the
    receiver's segment, `written` advanced by the sender and `read` by the receiver.
    Header words: 0 = bytes written, 1 = pid of the receiver, 2 = bytes read, 4 / 5 = the
    receiver / the sender left in order."""

    WRITTEN, READ, RECEIVER_LEFT, SENDER_LEFT = 0, 2, LEFT, LEFT + 1

    def __init__(self, seg: Segment, peer: int, ctx: OpContext, check) -> None:
        self.seg, self.peer, self.ctx, self.check = seg, peer, ctx, check
        self.buf = seg.data  # both slots as one ring buffer
        self.cap = len(self.buf)
        self.count = 0  # this side's position (written or read)

    def send(self, data: memoryview, deadline) -> None:
        src = np.frombuffer(data, dtype=np.uint8) if len(data) else None
        done, words = 0, self.seg.words
        while done < len(data):
            free = self.cap - (self.count - words[self.READ])
            if free == 0:
                spin_wait(lambda: words[self.READ] > self.count - self.cap, deadline, self.check,
                          lambda: f"rank {self.peer} to read", self.ctx, lambda: self.peer)
                continue
            at = self.count % self.cap
            k = min(free, len(data) - done, self.cap - at)
            self.buf[at:at + k] = src[done:done + k]
            done += k
            self.count += k
            words[self.WRITTEN] = self.count

    def recv_into(self, view: memoryview, deadline) -> None:
        dst = np.frombuffer(view, dtype=np.uint8) if len(view) else None
        done, words = 0, self.seg.words
        while done < len(view):
            avail = words[self.WRITTEN] - self.count
            if avail == 0:
                spin_wait(lambda: words[self.WRITTEN] > self.count, deadline, self.check,
                          lambda: f"data from rank {self.peer}", self.ctx, lambda: self.peer)
                continue
            at = self.count % self.cap
            k = min(avail, len(view) - done, self.cap - at)
            dst[done:done + k] = self.buf[at:at + k]
            done += k
            self.count += k
            words[self.READ] = self.count
