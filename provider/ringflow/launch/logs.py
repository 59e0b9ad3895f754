"""Worker output: each rank's pipe copied to DIR/workerlog.<rank> and, line by line with a
`[rank N] ` prefix, to the launcher's stdout; plus the tail of a log for failure reports.

Lines are cut by the one line rule (`ringflow.launch.lines`): a line ends at `\\n`, `\\r\\n` or
a lone `\\r`, and one longer than MAX_LINE_BYTES goes to the console in pieces (the log file
keeps it whole), so a worker printing without newlines cannot make the launcher buffer
without bound. A piece that is not a whole line (after a `\\r`, a long line's continuation, a
last line without its newline) goes out as `[rank N]+ ...`: only a whole line carries the
rank's own prefix, so a rank cannot print a line that reads as the launcher's or as another
rank's, or a machine line it did not print whole; and no Open MPI tag it printed reaches
the console as one (`untag`).

One lock guards the console and every line goes out in one write followed by a flush, so
lines of different ranks never interleave mid-line.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import BinaryIO

from ringflow.launch.lines import PARTIAL_MARK, LinePieces
from ringflow.launch.openmpi import TAG


def untag(line: bytes) -> bytes:
    """`line` with every Open MPI tag in it (`[1,0]<stdout>:`, as a rank may print one)
    spelled `[1,0] <stdout>:`: under mpirun, Open MPI tags the launcher's lines, and a tag in
    one would hand the rest of the line to another process (`openmpi.OutputJoiner`)."""
    return TAG.sub(lambda found: found[0].replace(b"]<", b"] <", 1), line)


class Console:
    """The launcher's stdout, shared by every pump thread and the launcher's own messages."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False

    def write_line(self, prefix: bytes, line: bytes) -> None:
        line = untag(line)
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(prefix + line)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # the reader of our stdout went away; the log files still get everything
                self._broken = True

    def info(self, text: str) -> None:
        """A launcher message: one `[launch] ` line per line of text."""
        for line in text.splitlines() or [""]:
            self.write_line(b"[launch] ", line.encode("utf-8", "replace"))


# What a ringflow worker prints on stderr when it begins to exit with rings open
# (ringflow.distributed.collective.registry, with RINGFLOW_REPORT_EXIT_TIME=1)
EXIT_TIME_PREFIX = b"ringflow-exit-time "


AFTER_PEER_FAILURE = b"after-peer-failure"


def _exit_report(line: bytes) -> tuple[float, bool, int | None] | None:
    """(unix time, whether it saw a peer fail first, the global rank it blamed) of an exit
    report line: `ringflow-exit-time T [after-peer-failure [R]]`."""
    words = line[len(EXIT_TIME_PREFIX):].split()
    try:
        at = float(words[0])
    except (ValueError, IndexError):
        return None
    after = words[1:2] == [AFTER_PEER_FAILURE]
    blamed = int(words[2]) if after and len(words) == 3 and words[2].isdigit() else None
    if len(words) > (3 if blamed is not None else 2 if after else 1):
        return None
    return at, after, blamed


class LogPump(threading.Thread):
    """Copies one worker's combined stdout+stderr pipe to its log file and the console."""

    def __init__(self, rank: int, pipe: BinaryIO, log_path: Path, console: Console) -> None:
        super().__init__(name=f"ringflow-log-rank{rank}", daemon=True)
        self.rank = rank
        self.log_path = log_path
        self._pipe = pipe
        self._console = console
        self._prefix = f"[rank {rank}] ".encode()
        self._partial_prefix = f"[rank {rank}]{PARTIAL_MARK} ".encode()
        self.began_exit_at: float | None = None  # the worker's own report (unix time)
        self.after_peer_failure = False  # ... saying it saw a peer fail before
        self.blamed_rank: int | None = None  # ... and which (global rank), where known
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed when the pipe ends
        self.lines = LinePieces(on_piece=self._piece,
                                on_crlf_rest=lambda: self._log.write(b"\n"))

    def run(self) -> None:
        try:
            while data := self._pipe.read1(1 << 16):
                self.lines.feed(data)
                self._log.flush()
            self.lines.flush()
        finally:
            self._log.close()
            self._pipe.close()

    def _piece(self, data: bytes, ending: bytes, whole: bool) -> None:
        if whole and data.startswith(EXIT_TIME_PREFIX):
            report = _exit_report(data)
            if report is not None:  # for the launcher, not for people
                self.began_exit_at, self.after_peer_failure, self.blamed_rank = report
                return
        self._log.write(data + ending)
        self._console.write_line(self._prefix if whole else self._partial_prefix, data)


def tail_lines(path: Path, count: int, max_bytes: int = 256 * 1024) -> list[str]:
    """The last `count` lines of a text log, reading at most its last `max_bytes`."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return list(deque(lines, maxlen=count))
