"""Output as whole lines, in bounded memory: the one line rule of every reader of a child's
output: the launcher's worker pumps (`logs`), the supervisor's output.log (`jobdir`),
mpirun's joined output (`openmpi`) and the provider's job backends
(`ringflow_provider.jobs.lines`).

Bytes arrive in chunks of any size; a line ends at `\\n`, `\\r\\n` or a lone `\\r` (a progress
bar redraws its line with `\\r`, and each redraw is a line of its own). A line longer than
MAX_LINE_BYTES is passed on in pieces of at most that size, cut between UTF-8 characters, so
memory stays bounded whatever a job prints.

A piece is *whole* when it began a line (the stream's start, or after a `\\n`) and ended with
`\\n` (or `\\r\\n`), uncut. Only whole lines can be machine lines (`[train] summary ...`, an
exit report): a program printing `x\\r[train] summary {...}`, a line's continuation after a
cut, or a last line without its newline cannot pass for one. Launchers show a piece that is
not whole with PARTIAL_MARK after their prefix (`[rank 3]+ 45%|####`), so readers
downstream can tell too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

__all__ = ["MAX_LINE_BYTES", "PARTIAL_MARK", "TAIL_LINES", "BoundedLines", "Line",
           "LinePieces", "LineSink", "LineSplitter"]

LineSink = Callable[[str, str], None]  # (stream "stdout" | "stderr", line (a Line), no ending)
MAX_LINE_BYTES = 1 << 20
TAIL_LINES = 20
#: after a launcher's prefix (`[rank N]`, Open MPI's tag): this piece is not a whole line
PARTIAL_MARK = "+"
_WHOLE_ENDINGS = (b"\n", b"\r\n")


def _utf8_cut(buf: bytearray, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 character (a continuation byte,
    0b10xxxxxx, never starts a piece), or `limit` when no character boundary is near."""
    cut = limit
    while cut > limit - 4 and cut > 0 and buf[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut if cut > 0 else limit


def _ending(piece: bytes) -> bytes:
    if piece.endswith(b"\r\n"):
        return b"\r\n"
    return piece[-1:] if piece.endswith((b"\n", b"\r")) else b""


class Line(str):
    """A decoded line (without its ending) that says whether it was a whole line of its
    stream (see the module's docstring): only a whole line can be a machine line."""

    whole: bool

    def __new__(cls, text: str, whole: bool = False) -> Line:
        line = super().__new__(cls, text)
        line.whole = whole
        return line

    def __reduce__(self) -> tuple[type[Line], tuple[str, bool]]:  # pickles and copies whole
        return Line, (str(self), self.whole)


class LinePieces:
    """Cuts one byte stream into pieces by the rule above and passes each to `piece(data,
    ending, start)`: `data` without its ending; `ending` b"\\n", b"\\r\\n", b"\\r", or b"" (a
    cut, or the text stopped there); `start` whether it began a line. Holds at most
    `max_line` bytes of an unfinished line."""

    def __init__(self, max_line: int = MAX_LINE_BYTES,
                 on_piece: Callable[[bytes, bytes, bool], None] | None = None,
                 on_crlf_rest: Callable[[], None] | None = None) -> None:
        """Subclasses override `piece` and `crlf_rest`, or pass `on_piece(data, ending,
        whole)` and `on_crlf_rest()`."""
        self._max = max_line
        self._on_piece = on_piece
        self._on_crlf_rest = on_crlf_rest
        self._pending = bytearray()
        self._after_cr = False  # the last piece ended with a lone \r: a \n next completes it
        self._start = True  # the pending piece begins a line

    def piece(self, data: bytes, ending: bytes, start: bool) -> None:
        if self._on_piece is not None:
            self._on_piece(data, ending, self.is_whole(ending, start))

    def crlf_rest(self) -> None:
        """The `\\n` of a `\\r\\n` whose `\\r` ended the last piece (the chunk cut between
        them): no line of its own; a reader keeping bytes writes it."""
        if self._on_crlf_rest is not None:
            self._on_crlf_rest()

    @property
    def pending(self) -> bool:
        """Whether part of a line waits for its ending."""
        return bool(self._pending)

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    @staticmethod
    def is_whole(ending: bytes, start: bool) -> bool:
        return start and ending in _WHOLE_ENDINGS

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._after_cr and data[:1] == b"\n":
            data = data[1:]
            self._start = True
            self.crlf_rest()
        self._after_cr = False
        # bytes.splitlines breaks at exactly \n, \r\n and \r, in linear time
        for chunk in data.splitlines(keepends=True):
            ending = _ending(chunk)
            self._after_cr = ending == b"\r"
            self._pending += chunk[:len(chunk) - len(ending)] if ending else chunk
            if ending:
                self._end(ending)
            else:
                self._overflow()

    def flush(self) -> None:
        """The stream ended (or its text stops here): a last line without an ending is still
        passed on (not whole), and a `\\n` that comes next ends a line of its own."""
        if self._pending:
            self._end(b"")
        self._after_cr = False

    def _overflow(self) -> None:
        while len(self._pending) > self._max:
            cut = _utf8_cut(self._pending, self._max)
            with memoryview(self._pending) as view:  # one copy of the piece, not two
                data = bytes(view[:cut])
            del self._pending[:cut]
            self._emit(data, b"")

    def _end(self, ending: bytes) -> None:
        self._overflow()
        data = bytes(self._pending)
        self._pending.clear()
        self._emit(data, ending)

    def _emit(self, data: bytes, ending: bytes) -> None:
        start, self._start = self._start, ending in _WHOLE_ENDINGS
        self.piece(data, ending, start)


class BoundedLines(LinePieces):
    """Passes each line of one byte stream (without its ending) to `emit`, as bytes."""

    def __init__(self, emit: Callable[[bytes], None], max_line: int = MAX_LINE_BYTES) -> None:
        super().__init__(max_line)
        self._emit_raw = emit

    def piece(self, data: bytes, ending: bytes, start: bool) -> None:
        self._emit_raw(data)


class LineSplitter(LinePieces):
    """Feeds the decoded lines (each a `Line`) of one stream to `sink` and keeps the last
    TAIL_LINES in `tail` (which several splitters may share, so the tail interleaves stdout
    and stderr). The `\\n` of a `\\r\\n` cut between two reads is no line of its own."""

    def __init__(self, stream: str, sink: LineSink, tail: deque[str] | None = None,
                 max_line: int = MAX_LINE_BYTES) -> None:
        super().__init__(max_line)
        self.stream = stream
        self.sink = sink
        self.tail = deque(maxlen=TAIL_LINES) if tail is None else tail

    def piece(self, data: bytes, ending: bytes, start: bool) -> None:
        line = Line(data.decode("utf-8", "replace"), self.is_whole(ending, start))
        self.tail.append(line)
        self.sink(self.stream, line)
