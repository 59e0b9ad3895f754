"""The folder of a supervised job (`ringflow.launch.supervisor`): what is in it, how it is
written and how a watcher reads it. The layout is the contract between the supervisor on a
host and whoever watches the job from elsewhere (an Airflow task, a trigger, over SSH or on
this host)::

    output.log    the job's stdout and stderr as they came, append-only: offsets are bytes
    status.json   state, pids, times, exit code, cause; replaced atomically on every change
    lease         its mtime is the watcher's last sign of life; its content the offset of
                  output.log the watcher has shown (so a new watcher goes on from there)
    lock          flock-ed by the supervisor for its whole life: free = no supervisor
    stop          written by `supervisor stop`: why the job is being stopped
    supervisor.log the supervisor's own errors (a traceback, if it ever has one)

Every file is 0600 in a 0700 folder; no secret is ever written to any of them. output.log
holds whole lines of both streams as they complete (a line ends at a newline or a carriage
return); a line the command wrote to stderr starts with STDERR_MARK (an ASCII group
separator, invisible in most viewers), which readers take off.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringflow.launch.lines import LinePieces
from ringflow.secrets import MIN_MASKED_LEN  # shorter values are not replaced anywhere

OUTPUT, STATUS, LEASE, LOCK, STOP, OWN_LOG = (
    "output.log", "status.json", "lease", "lock", "stop", "supervisor.log")
STATUS_VERSION = 1
# states a status.json can hold; "ended" is final
STARTING, RUNNING, STOPPING, ENDED = "starting", "running", "stopping", "ended"
# what a watcher calls a job whose supervisor vanished without writing "ended"
LOST = "lost"
PEEK_SEPARATOR = "\x1e--ringflow-peek--\x1e"
MARKER_VAR = "RINGFLOW_SUPERVISED"  # in the environment of every process of a job
STDERR_MARK = b"\x1d"


def make_dir(path: Path) -> Path:
    """The job folder, made 0700 (its parents as the umask says); a folder that exists must
    be a real folder of this user, not a symlink (someone else's files are never written)."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
        raise PermissionError(f"job folder {path} is not a folder of this user")
    os.chmod(path, 0o700)
    return path


def write_json(path: Path, value: dict[str, Any]) -> None:
    """`path` replaced at once by `value` (write aside, then rename): a reader sees the old
    content or the new one, never half of either."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f, sort_keys=True)
        f.write("\n")
    os.replace(temporary, path)


MASK = b"***"


class OutputWriter:
    """The command's stdout and stderr into output.log (an O_APPEND descriptor) as whole
    lines cut by the one line rule (`ringflow.launch.lines`: a line ends at a newline or a
    carriage return, one longer than MAX_LINE_BYTES is written in pieces, so at most that
    much of a stream waits for its line's end), so the two streams never split each other's
    lines; every byte kept, stderr lines marked, and the job's secret values (`secrets`)
    replaced by *** : no secret is written to the folder even when the job prints one."""

    def __init__(self, fd: int, secrets: list[str] | tuple[str, ...] = ()) -> None:
        self.fd = fd
        self._secrets = sorted({s.encode() for s in secrets if len(s) >= MIN_MASKED_LEN},
                               key=len, reverse=True)
        self._at_line_start = {"stdout": True, "stderr": True}
        self._out = bytearray()  # what one feed writes, in one write
        self._lines = {stream: LinePieces(on_piece=functools.partial(self._piece, stream),
                                          on_crlf_rest=functools.partial(self._out.extend,
                                                                         b"\n"))
                       for stream in ("stdout", "stderr")}

    def feed(self, stream: str, data: bytes) -> None:
        self._lines[stream].feed(data)
        self._write()

    def flush(self) -> None:
        """The streams ended: what is pending is written (output.log's last line may then
        lack its newline until the supervisor ends it)."""
        for lines in self._lines.values():
            lines.flush()
        self._write()

    @property
    def pending_bytes(self) -> int:
        """Bytes held for lines not yet ended."""
        return sum(lines.pending_bytes for lines in self._lines.values())

    def _piece(self, stream: str, data: bytes, ending: bytes, _whole: bool) -> None:
        chunk = data + ending
        if stream == "stderr" and self._at_line_start[stream]:
            chunk = STDERR_MARK + chunk
        self._at_line_start[stream] = bool(ending)
        for secret in self._secrets:
            chunk = chunk.replace(secret, MASK)
        self._out += chunk

    def _write(self) -> None:
        view = memoryview(bytes(self._out))
        self._out.clear()
        while view:
            view = view[os.write(self.fd, view):]


def read_status(job_dir: Path) -> dict[str, Any] | None:
    """status.json, or None when there is none (yet) or it cannot be read."""
    try:
        value = json.loads((Path(job_dir) / STATUS).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def supervisor_alive(job_dir: Path) -> bool:
    """Whether a supervisor holds the job's lock (the lock is released by the kernel when
    the supervisor dies, however it dies; a pid could have been reused, a lock cannot)."""
    try:
        fd = os.open(Path(job_dir) / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the lock taken just now
    return False


def hold_lock(job_dir: Path) -> int:
    """Take the job's lock for this process's life; BlockingIOError if another holds it."""
    fd = os.open(Path(job_dir) / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


def renew_lease(job_dir: Path, shown: int | None = None) -> None:
    """Renew the lease now; with `shown`, record that output.log was shown up to there."""
    path = Path(job_dir) / LEASE
    if shown is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        os.utime(path)
        return
    write_json(path, {"shown": int(shown)})


def lease_age(job_dir: Path, now: float | None = None) -> float | None:
    """Seconds since the lease was last renewed (by this host's clock); None if missing."""
    try:
        mtime = (Path(job_dir) / LEASE).stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def shown_offset(job_dir: Path) -> int:
    """How far a watcher has shown output.log (0 if no watcher said so)."""
    try:
        value = json.loads((Path(job_dir) / LEASE).read_text() or "{}")
    except (OSError, ValueError):
        return 0
    shown = value.get("shown") if isinstance(value, dict) else None
    return shown if isinstance(shown, int) and shown >= 0 else 0


def whole_lines(data: bytes) -> bytes:
    """The part of `data` that ends with its last newline (a watcher shows only whole
    lines and comes back for the rest)."""
    end = data.rfind(b"\n")
    return data[:end + 1] if end >= 0 else b""


@dataclass(frozen=True)
class Peek:
    """One look at a job from outside: its status, whether its supervisor lives, how big
    its output is, the whole lines from an offset, the offset shown so far."""

    status: dict[str, Any] | None
    alive: bool
    size: int
    data: bytes  # whole lines of output.log from the offset asked for
    shown: int
    lease_age: float | None  # seconds since the lease was renewed, by the job host's clock

    @property
    def state(self) -> str:
        """The job's state; `lost` when status.json says it runs but no supervisor does."""
        state = (self.status or {}).get("state", STARTING)
        if state != ENDED and not self.alive and self.status is not None:
            return LOST
        return state


def peek(job_dir: Path, offset: int, max_bytes: int) -> Peek:
    """`peek_command` done in this process (for a job on this host)."""
    job_dir = Path(job_dir)
    status = read_status(job_dir)
    alive = supervisor_alive(job_dir)
    data, size = b"", 0
    with contextlib.suppress(FileNotFoundError), open(job_dir / OUTPUT, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(offset)
        data = f.read(max(0, min(max_bytes, size - offset)))
    age = lease_age(job_dir)
    return Peek(status, alive, size, whole_lines(data), shown_offset(job_dir),
                None if age is None else float(int(age)))


def peek_command(job_dir: str, offset: int, max_bytes: int) -> str:
    """The same look as one POSIX sh command for a remote host (no Python started: a
    watcher may run it every few seconds for many jobs). `job_dir` is absolute or relative
    to the login's home. Prints status.json, whether the lock is held, the output's size,
    the lease, then at most `max_bytes` of output.log from `offset` (`parse_peek` keeps the
    whole lines)."""
    sep = shlex.quote(PEEK_SEPARATOR)
    script = (
        f"d={shlex.quote(job_dir)}; "
        f'cat "$d/{STATUS}" 2>/dev/null; printf "\\n%s\\n" {sep}; '
        f'if [ -e "$d/{LOCK}" ] && ! flock -n -s "$d/{LOCK}" true 2>/dev/null; '
        f"then echo alive; else echo gone; fi; "
        f'wc -c < "$d/{OUTPUT}" 2>/dev/null || echo 0; '
        f'm=$(stat -c %Y "$d/{LEASE}" 2>/dev/null) && echo $(( $(date +%s) - m )) || echo -; '
        f'cat "$d/{LEASE}" 2>/dev/null; printf "\\n%s\\n" {sep}; '
        f'tail -c +{int(offset) + 1} "$d/{OUTPUT}" 2>/dev/null | head -c {int(max_bytes)}'
    )
    return f"sh -c {shlex.quote(script)}"


def renew_command(job_dir: str, shown: int | None = None) -> str:
    """`renew_lease` as one POSIX sh command for a remote host."""
    d = shlex.quote(job_dir)
    if shown is None:
        script = f'd={d}; umask 077; touch "$d/{LEASE}"'
    else:
        script = (f'd={d}; umask 077; printf \'{{"shown": {int(shown)}}}\\n\' '
                  f'> "$d/.{LEASE}.tmp" && mv -f "$d/.{LEASE}.tmp" "$d/{LEASE}"')
    return f"sh -c {shlex.quote(script)}"


def parse_peek(out: bytes) -> Peek:
    """What `peek_command` printed, as a Peek."""
    sep = f"\n{PEEK_SEPARATOR}\n".encode()
    head, _, rest = out.partition(sep)
    middle, _, data = rest.partition(sep)
    try:
        status = json.loads(head) if head.strip() else None
    except ValueError:
        status = None
    words = middle.split(b"\n", 3) + [b""] * 3
    alive = words[0].strip() == b"alive"
    size = int(words[1]) if words[1].strip().isdigit() else 0
    age = float(max(0, int(words[2]))) if words[2].strip().lstrip(b"-").isdigit() else None
    try:
        lease = json.loads(words[3]) if words[3].strip() else {}
    except ValueError:
        lease = {}
    shown = lease.get("shown") if isinstance(lease, dict) else None
    return Peek(status if isinstance(status, dict) else None, alive, size, whole_lines(data),
                shown if isinstance(shown, int) and shown >= 0 else 0, age)


def boot_id() -> str:
    """This host's boot id: with the host name, what tells a watcher whether it runs on
    the job's host (a local job can only be watched there)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
