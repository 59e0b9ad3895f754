"""Output as whole lines, in bounded memory: the one line splitter of the runtime (mpirun's
joined output) and of the provider's job backends (`ringflow_provider.jobs.lines`).

Bytes arrive in chunks of any size; a line ends at `\\n`, `\\r\\n` or a lone `\\r` (a progress
bar redraws its line with `\\r`, and each redraw is a line of its own). A line longer than
MAX_LINE_BYTES is passed on in pieces of at most that size, cut between UTF-8 characters, so
memory stays bounded whatever a job prints (the launcher caps its own console lines the same
way).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

__all__ = ["MAX_LINE_BYTES", "TAIL_LINES", "BoundedLines", "LineSink", "LineSplitter"]

LineSink = Callable[[str, str], None]  # (stream "stdout" | "stderr", whole line, no ending)
MAX_LINE_BYTES = 1 << 20
TAIL_LINES = 20
_ENDINGS = (b"\r\n", b"\n", b"\r")


def _utf8_cut(buf: bytearray, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 character (a continuation byte,
    0b10xxxxxx, never starts a piece), or `limit` when no character boundary is near."""
    cut = limit
    while cut > limit - 4 and cut > 0 and buf[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut if cut > 0 else limit


class BoundedLines:
    """Passes each whole line of one byte stream (without its ending) to `emit`; holds at
    most `max_line` bytes of an unfinished line."""

    def __init__(self, emit: Callable[[bytes], None], max_line: int = MAX_LINE_BYTES) -> None:
        self._emit_raw = emit
        self._max = max_line
        self._pending = bytearray()
        self._after_cr = False  # the last line ended with a lone \r: a \n next completes it

    @property
    def pending(self) -> bool:
        """Whether part of a line waits for its ending."""
        return bool(self._pending)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._after_cr and data[:1] == b"\n":
            data = data[1:]
        self._after_cr = False
        # bytes.splitlines breaks at exactly \n, \r\n and \r, in linear time
        for piece in data.splitlines(keepends=True):
            self._after_cr = piece.endswith(b"\r")
            if piece.endswith(_ENDINGS):
                self._pending += piece[:-2 if piece.endswith(b"\r\n") else -1]
                self._emit_pending()
            else:
                self._pending += piece
                self._emit_overflow()

    def flush(self) -> None:
        """The stream ended (or its text stops here): a last line without an ending is still
        a line, and a `\\n` that comes next starts a line of its own."""
        if self._pending:
            self._emit_pending()
        self._after_cr = False

    def _emit_overflow(self) -> None:
        while len(self._pending) > self._max:
            cut = _utf8_cut(self._pending, self._max)
            with memoryview(self._pending) as view:  # one copy of the piece, not two
                piece = bytes(view[:cut])
            del self._pending[:cut]
            self._emit_raw(piece)

    def _emit_pending(self) -> None:
        self._emit_overflow()
        self._emit_raw(bytes(self._pending))
        self._pending.clear()


class LineSplitter(BoundedLines):
    """Feeds the decoded lines of one stream to `sink` and keeps the last TAIL_LINES in `tail`
    (which several splitters may share, so the tail interleaves stdout and stderr)."""

    def __init__(self, stream: str, sink: LineSink, tail: deque[str] | None = None,
                 max_line: int = MAX_LINE_BYTES) -> None:
        super().__init__(self._line, max_line)
        self.stream = stream
        self.sink = sink
        self.tail = deque(maxlen=TAIL_LINES) if tail is None else tail

    def _line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace")
        self.tail.append(line)
        self.sink(self.stream, line)
