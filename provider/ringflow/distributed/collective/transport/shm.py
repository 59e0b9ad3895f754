"""Shared-memory transport for the ranks of one host: one segment per rank,
/dev/shm/ringflow-<job id>-ring<ring>-<tag>-p<position>, holding a header of counters and two
data slots (the intra-host algorithm), or, for a ring hop between two ranks of one host inside
a ring that spans hosts, a `Channel` segment ...-ch<position> owned by the receiving rank.
<tag> is HMAC(job token, job, ring, member endpoints): several communicators of one job share a
ring id (every model-parallel group of a tensor-parallel job is ring 0), and a name nobody
without the token can guess cannot be planted or collide across jobs.

Segments are ours or refused: created 0600 with O_EXCL and never through a symlink; a name
that exists already is reused only when it is our own file whose creator is dead (a crashed
earlier incarnation), else a CommError names its owner; a segment is opened only when it is a
regular file of our user with mode 0600. Segments are unlinked as soon as every peer has mapped
them, so a crash leaks nothing after setup; an atexit hook unlinks any this process created
and still holds a name for.

Synchronisation is by monotonically increasing sequence counters in each header (one writer
each). x86 keeps stores in program order (TSO), so data written before a counter store are
visible to a reader that sees the new counter value.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import stat
import time

import numpy as np

from ringflow.distributed.collective.transport.base import OpContext, process_state, spin_wait
from ringflow.errors import CommError
from ringflow.naming import shm_prefix

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


def segment_name(job_id: str, ring_id: int, tag: str, pos: int) -> str:
    return f"{shm_prefix(job_id)}ring{ring_id}-{tag}-p{pos}"


def channel_name(job_id: str, ring_id: int, tag: str, pos: int) -> str:
    return f"{shm_prefix(job_id)}ring{ring_id}-{tag}-ch{pos}"


# glibc's memmove runs up to 13x slower (128-256 KiB, measured here) when source and
# destination sit at nearly the same offset within a page, which is the common case for a
# copy out of a slot (slots are page-aligned, numpy puts large buffers 16 bytes into a page);
# an integer ufunc copies the same bytes without that penalty (about as fast as an unaliased
# memmove). Small copies do not hit it; from 512 KiB memmove takes another path.
_ALIASED_COPY_MIN = 16 << 10
_ALIAS_GAP = 64


def copy_out(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for a `src` in shared memory (both contiguous, same shape)."""
    n = src.nbytes
    if n >= _ALIASED_COPY_MIN:
        d, s = dst.ctypes.data, src.ctypes.data
        gap = (d - s) % 4096
        if gap < _ALIAS_GAP or gap > 4096 - _ALIAS_GAP:
            for width, itype in ((8, np.int64), (4, np.int32)):
                if n % width == 0 and d % width == 0 and s % width == 0:
                    np.positive(src.reshape(-1).view(itype), out=dst.reshape(-1).view(itype))
                    return
    np.copyto(dst, src)


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
    flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        _reclaim(path)   # ours and its creator dead, else a CommError naming the holder
        fd = os.open(path, flags, 0o600)
    _created.add(name)
    try:
        os.fchmod(fd, 0o600)   # exactly, whatever the umask
        os.ftruncate(fd, HEADER + 2 * slot_bytes)
        try:
            # the pages now: a full /dev/shm is an error here, not a SIGBUS at first touch
            os.posix_fallocate(fd, 0, HEADER + 2 * slot_bytes)
        except OSError as exc:
            unlink(name)
            raise CommError(f"cannot reserve {HEADER + 2 * slot_bytes} bytes in {path}: "
                            f"{exc.strerror} ({SHM_DIR} is full or too small?)") from None
        mm = mmap.mmap(fd, HEADER + 2 * slot_bytes)
    finally:
        os.close(fd)
    seg = Segment(mm, slot_bytes)
    seg.words[PID] = os.getpid()
    return seg


def _describe(st: os.stat_result) -> str:
    try:
        import pwd

        user = pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        user = "?"
    return f"user {user} (uid {st.st_uid}), mode {stat.filemode(st.st_mode)}"


def _reclaim(path: str) -> None:
    """A segment name already taken: unlink it when it is our regular file whose creating
    process is gone (a crashed earlier incarnation of the ring: never reuse its data)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        raise CommError(f"shared-memory segment {path} is held by {_describe(st)}: not this "
                        f"job's; refusing to use or remove it")
    holder = creator_pid(path)
    if holder and holder != os.getpid() and process_state(holder) not in (None, "Z", "X"):
        raise CommError(f"shared-memory segment {path} is held by the live process {holder}: "
                        f"another incarnation of this job is running")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def creator_pid(path: str) -> int:
    """The pid in a segment's header (0 when unreadable or not a ringflow segment)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        raw = os.pread(fd, 16, 0)
    finally:
        os.close(fd)
    return int.from_bytes(raw[8:16], "little", signed=True) if len(raw) == 16 else 0


def open_segment(name: str, slot_bytes: int) -> Segment:
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise CommError(f"cannot open shared-memory segment {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() \
                or stat.S_IMODE(st.st_mode) != 0o600:
            raise CommError(f"shared-memory segment {path} is held by {_describe(st)}: "
                            f"expected a file of this user with mode 0600")
        if st.st_size != HEADER + 2 * slot_bytes:
            raise CommError(f"shared-memory segment {path} has size {st.st_size}, expected "
                            f"{HEADER + 2 * slot_bytes}")
        mm = mmap.mmap(fd, HEADER + 2 * slot_bytes)
    finally:
        os.close(fd)
    return Segment(mm, slot_bytes)


def room_for(nbytes: int) -> bool:
    """Whether /dev/shm has room for `nbytes` more with as much again to spare."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 2 * nbytes


def map_group(names: list[str], pos: int, slot_bytes: int, barrier) -> list[Segment]:
    """Map the segments of a group of ranks of this host, `names[p]` created by the rank at
    position p (this one is at `pos`); `barrier()` waits for every rank of the ring. Each
    name is unlinked once every peer has mapped it. Returns the segments by position."""
    own = create_segment(names[pos], slot_bytes)
    try:
        barrier()  # every segment exists
        segs = [own if p == pos else open_segment(names[p], slot_bytes)
                for p in range(len(names))]
        barrier()  # every peer has mapped every segment
    finally:
        unlink(names[pos])
    return segs


def group_watch(segs: list[Segment], pos: int, ranks: list[int], ctx: OpContext,
                stopped_limit: float) -> PeerWatch:
    """The liveness watch of a group mapped by ``map_group``: every peer (`ranks[p]` is the
    rank at position p) by the pid and the LEFT word in its segment's header."""
    peers = [p for p in range(len(segs)) if p != pos]
    return PeerWatch({ranks[p]: int(segs[p].words[PID]) for p in peers}, ctx, stopped_limit,
                     {ranks[p]: (segs[p].words, LEFT) for p in peers})


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
                raise self.ctx.error(rank, f"{self.ctx.name(rank)} left early: it finished "
                                     "and closed this ring in order while this rank still "
                                     "waits for it (did every rank run the same "
                                     "collectives?)")
            state = process_state(pid)
            if state is None or state in "ZX":
                raise self.ctx.error(rank, f"{self.ctx.name(rank)} (pid {pid}) died")
            if state in "Tt":
                since = self._stopped_since.setdefault(rank, now)
                if now - since > self.stopped_limit:
                    raise self.ctx.error(rank, f"{self.ctx.name(rank)} (pid {pid}) has been "
                                         f"stopped for {now - since:.0f} s "
                                         "(RINGFLOW_HEARTBEAT_TIMEOUT)")
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
                          lambda: f"{self.ctx.name(self.peer)} to read", self.ctx,
                          lambda: self.peer)
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
                          lambda: f"data from {self.ctx.name(self.peer)}", self.ctx,
                          lambda: self.peer)
                continue
            at = self.count % self.cap
            k = min(avail, len(view) - done, self.cap - at)
            copy_out(dst[done:done + k], self.buf[at:at + k])
            done += k
            self.count += k
            words[self.READ] = self.count
