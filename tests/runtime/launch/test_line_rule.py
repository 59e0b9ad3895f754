"""Every reader of a child's output keeps to the one bounded line rule
(`ringflow.launch.lines`): the launcher's worker pump, the supervisor's output.log writer,
mpirun's tagged-output joiner (ringflow-poprun) and the provider's line splitter each hold at
most MAX_LINE_BYTES of a line that has not ended, however much a real child prints without
a newline or how many `\\r` redraws it prints. Measured as the bytes each holds after every
read, not as time."""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from ringflow.launch.jobdir import OutputWriter
from ringflow.launch.lines import MAX_LINE_BYTES, Line, LineSplitter
from ringflow.launch.logs import Console, LogPump
from ringflow.launch.openmpi import OutputJoiner

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20
NO_NEWLINE = ("import sys\nout = sys.stdout.buffer\n"
              "for _ in range(50):\n    out.write(b'x' * (1 << 20))\nout.flush()\n")
REDRAWS = 200_000
PROGRESS = (f"import sys\nout = sys.stdout.buffer\nfor n in range({REDRAWS}):\n"
            "    out.write(b'step %06d |####      |\\r' % n)\nout.flush()\n")


def child(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)


def chunks(proc: subprocess.Popen[bytes]) -> Iterator[bytes]:
    assert proc.stdout is not None
    while data := proc.stdout.read1(1 << 16):
        yield data
    assert proc.wait(30) == 0


class Readers:
    """The supervisor's writer, mpirun's joiner and the provider's splitter, fed the same
    bytes; `peaks` the most each held after any read; `lines` how many lines the joiner and
    the splitter passed on."""

    def __init__(self) -> None:
        self.lines = {"joiner": 0, "splitter": 0}
        self._null = os.open(os.devnull, os.O_WRONLY)
        self.writer = OutputWriter(self._null)
        self.joiner = OutputJoiner(lambda _index, _line: self._count("joiner"))
        self.splitter = LineSplitter("stdout", lambda _stream, _line: self._count("splitter"))
        self.joiner.feed(b"[1,0]<stdout>:")
        self.peaks = {"output.log": 0, "joiner": 0, "splitter": 0}

    def _count(self, name: str) -> None:
        self.lines[name] += 1

    def feed(self, data: bytes) -> None:
        self.writer.feed("stdout", data)
        self.joiner.feed(data)
        self.splitter.feed(data)
        for name, held in (("output.log", self.writer.pending_bytes),
                           ("joiner", self.joiner.held_bytes),
                           ("splitter", self.splitter.pending_bytes)):
            self.peaks[name] = max(self.peaks[name], held)

    def close(self) -> None:
        self.writer.flush()
        self.joiner.close()
        self.splitter.flush()
        os.close(self._null)


def pump_peak(script: str, tmp_path) -> tuple[int, bytes]:
    """The most the launcher's pump of one real worker held after any read; its console."""
    proc = child(script)
    console = io.BytesIO()
    pump = LogPump(0, proc.stdout, tmp_path / "workerlog.0", Console(console))
    peak = 0
    feed: Callable[[bytes], None] = pump.lines.feed

    def measured(data: bytes) -> None:
        nonlocal peak
        feed(data)
        peak = max(peak, pump.lines.pending_bytes)

    pump.lines.feed = measured  # type: ignore[method-assign]
    pump.run()
    assert proc.wait(30) == 0
    return peak, console.getvalue()


def test_fifty_mib_without_a_newline_are_held_a_line_limit_at_most_by_every_reader(tmp_path):
    readers = Readers()
    for data in chunks(child(NO_NEWLINE)):
        readers.feed(data)
    readers.close()
    assert all(peak <= MAX_LINE_BYTES for peak in readers.peaks.values()), readers.peaks
    assert readers.lines == {"joiner": 50, "splitter": 50}
    peak, console = pump_peak(NO_NEWLINE, tmp_path)
    assert peak <= MAX_LINE_BYTES
    assert console.count(b"\n") == 50 and console.count(b"[rank 0]+ ") == 50
    assert (tmp_path / "workerlog.0").stat().st_size == 50 * MIB  # the log keeps it whole


def test_carriage_return_redraws_are_a_line_each_and_hold_one_redraw(tmp_path):
    readers = Readers()
    for data in chunks(child(PROGRESS)):
        readers.feed(data)
    readers.close()
    redraw = len("step 000000 |####      |")
    assert readers.peaks["output.log"] <= redraw and readers.peaks["splitter"] <= redraw
    assert readers.peaks["joiner"] <= redraw + 64  # and the start of a tag a read cut off
    assert readers.lines == {"joiner": REDRAWS, "splitter": REDRAWS}
    peak, console = pump_peak(PROGRESS, tmp_path)
    assert peak <= redraw and console.count(b"\n") == REDRAWS


# the rule itself ---------------------------------------------------------------------------
def pieces_of(reads: list[bytes], max_line: int = MAX_LINE_BYTES) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    splitter = LineSplitter("stdout", lambda _stream, line: out.append((line, line.whole)),
                            max_line=max_line)
    for data in reads:
        splitter.feed(data)
    splitter.flush()
    return out


def test_a_piece_is_whole_when_it_began_a_line_and_ended_with_a_newline_uncut():
    data = b"a\nb\rc\nd\n\nlong-line\nend"
    expected = [("a", True), ("b", False), ("c", False), ("d", True), ("", True),
                ("long", False), ("-lin", False), ("e", False), ("end", False)]
    for size in (1, 2, 3, len(data)):
        reads = [data[i:i + size] for i in range(0, len(data), size)]
        assert pieces_of(reads, max_line=4) == expected, f"read size {size}"
    assert pieces_of([b"a\r\nb\rc\r\nd\r\n"]) == [("a", True), ("b", False), ("c", False),
                                                 ("d", True)]


def test_a_crlf_cut_between_two_reads_ends_one_line_and_starts_the_next_one_whole():
    # the \r ends the line at once (a progress bar's redraw is shown as it comes), so that
    # line is no whole one; the \n that completes it is no line of its own
    assert pieces_of([b"a\r", b"\nb\n"]) == [("a", False), ("b", True)]


def test_a_line_keeps_its_wholeness_through_pickle_and_copy():
    line = pieces_of([b"x\n"])[0][0]
    assert isinstance(line, Line)
    assert pickle.loads(pickle.dumps(line)).whole and copy.deepcopy(line).whole
    assert not pickle.loads(pickle.dumps(Line("y", False))).whole
