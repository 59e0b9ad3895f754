"""`ringflow.launch.openmpi`: mpirun's tagged output joined into whole lines in bounded memory
(a line ends at \\n, \\r\\n or a lone \\r; one longer than 1 MiB comes in pieces cut between
UTF-8 characters), whatever the reads cut; and the mpirun command a plan of app contexts
becomes. No mpirun runs here (test_poprun.py and test_mpirun_agents.py run the real one)."""

from __future__ import annotations

import tracemalloc
from collections import Counter

from ringflow.launch.lines import MAX_LINE_BYTES, BoundedLines
from ringflow.launch.openmpi import (
    INSTANCE_SH,
    AppContext,
    MpirunPlan,
    OutputJoiner,
    exported_names,
    exported_values,
    mpirun_argv,
)

MIB = 1 << 20


def joined(chunks) -> list[tuple[int | None, str]]:
    lines: list[tuple[int | None, str]] = []
    joiner = OutputJoiner(lambda index, line: lines.append((index, line)))
    for chunk in chunks:
        joiner.feed(chunk)
    joiner.close()
    return lines


def pieces(data: bytes, size: int):
    return (data[i:i + size] for i in range(0, len(data), size))


class Sizes:
    """Counts lines by (index, length in characters, decoded cleanly): keeping the lines
    would make the memory measured here the test's, not the joiner's."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int | None, int, bool]] = Counter()
        self.first: str | None = None

    def __call__(self, index: int | None, line: str) -> None:
        self.counts[(index, len(line), "\ufffd" not in line)] += 1
        if self.first is None:
            self.first = line


def feed_measured(chunks) -> tuple[Sizes, int]:
    """(what came out, the peak of memory allocated while feeding, in bytes)."""
    sizes = Sizes()
    joiner = OutputJoiner(sizes)
    tracemalloc.start()
    try:
        for chunk in chunks:
            joiner.feed(chunk)
        joiner.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return sizes, peak


def test_ten_mib_without_a_newline_come_out_in_pieces_of_at_most_one_mib_in_bounded_memory():
    payload = "€" * (10 * MIB // 3 + 1)  # 3-byte characters: 1 MiB is no character boundary
    stream = b"[1,0]<stdout>:" + payload.encode()

    def chunks():  # made as they are read, so the test holds no copy of the stream
        yield from pieces(stream, 65537)

    sizes, peak = feed_measured(chunks())
    # 1 MiB - 1 bytes is the last character boundary before 1 MiB: 349525 characters, and
    # every piece decodes cleanly (no character cut in two)
    assert sizes.counts == {(0, (MIB - 1) // 3, True): 10, (0, 4, True): 1}
    # the pending bytes, one piece and its decoding: a few MiB however long the line is (the
    # joiner before this held the whole line, and copied it at every read)
    assert peak < 6 * MIB, f"the joiner held {peak / MIB:.1f} MiB"


def test_carriage_return_progress_output_is_a_line_per_redraw_in_bounded_memory():
    # as Open MPI passes a progress bar on: one tagged piece per redraw, never a newline
    redraws = 20_000
    sizes, peak = feed_measured(f"[1,2]<stdout>:step {n:>6} |####      |\r".encode()
                                for n in range(redraws))
    assert sizes.first == "step      0 |####      |"
    assert sizes.counts == {(2, len(sizes.first), True): redraws}
    assert peak < 64 * 1024, f"the joiner held {peak / MIB:.1f} MiB"


def test_redraws_in_one_piece_and_crlf_endings_are_lines_without_empty_ones():
    assert joined([b"[1,0]<stdout>:10%\r20%\r30%\n[1,1]<stdout>:a\r\n[1,0]<stdout>:b\r\n"]) == [
        (0, "10%"), (0, "20%"), (0, "30%"), (1, "a"), (0, "b")]


def test_fragments_of_one_line_join_across_other_instances_and_any_cut_of_the_reads():
    stream = (b"mpirun says\n[1,0]<stdout>:first-[1,1]<stdout>:1 alone\n"
              b"[1,2]<stderr>:2 \xe2\x82\xac[1,0]<stdout>:second-[1,1]<stdout>:10%\r"
              b"[1,0]<stdout>:third\n[1,2]<stderr>:end\n")
    expected = [(None, "mpirun says"), (1, "1 alone"), (1, "10%"), (0, "first-second-third"),
                (2, "2 €end")]
    for size in (1, 2, 3, 5, 7, 13, len(stream)):
        assert joined(pieces(stream, size)) == expected, f"read size {size}"


def test_a_tag_cut_by_a_read_is_not_text_and_a_bracket_that_is_no_tag_is():
    assert joined([b"[1,0]<std", b"out>:x\n"]) == [(0, "x")]
    assert joined([b"[1,0]<stdout>:see [1", b"2] here\n"]) == [(0, "see [12] here")]
    assert joined([b"[1,0]<stdout>:ends with [", b""]) == [(0, "ends with [")]


def test_a_line_of_one_instance_longer_than_the_limit_is_cut_and_the_rest_still_joins():
    lines: list[tuple[int | None, str]] = []
    joiner = OutputJoiner(lambda index, line: lines.append((index, line)), max_line=8)
    for chunk in (b"[1,0]<stdout>:abcdef", b"[1,1]<stdout>:x\n", b"[1,0]<stdout>:ghijk\n"):
        joiner.feed(chunk)
    joiner.close()
    assert lines == [(1, "x"), (0, "abcdefgh"), (0, "ijk")]


def test_bounded_lines_never_cut_a_utf8_character_and_keep_every_byte():
    out: list[bytes] = []
    lines = BoundedLines(out.append, max_line=8)
    text = "aé€𝄞" * 5 + "\n"
    for byte in text.encode():
        lines.feed(bytes([byte]))
    # each piece decodes on its own (a cut character would raise here)
    assert "".join(piece.decode() for piece in out) == text[:-1]
    assert max(len(piece) for piece in out) == 8 and len(out) > 1
    assert MAX_LINE_BYTES == MIB


# the command ------------------------------------------------------------------------------
def test_a_plan_becomes_one_app_context_per_process_with_its_host_options_and_env():
    plan = MpirunPlan((AppContext("h1", ("prog", "-v"), slots=2, options=("-x", "A=1")),
                       AppContext("h2", ("prog",), env={"B": "2", "A": "no"},
                                  options=("-x", "A"))), ("--mca", "x", "y"))
    argv = mpirun_argv(plan, {"PATH": "/bin", "RINGFLOW_JOB_TOKEN": "t"}, as_root=False)
    tail = ["-x", "RINGFLOW_REPORT_EXIT_TIME=1", "sh", "-c", INSTANCE_SH,
            "ringflow-poprun-instance"]
    assert argv == ["mpirun", "--tag-output", "--bind-to", "none", "--mca", "x", "y",
                    "-np", "1", "-H", "h1:2", "-x", "A=1", "-x", "PATH", "-x",
                    "RINGFLOW_JOB_TOKEN", *tail, "prog", "-v", ":",
                    "-np", "1", "-H", "h2:1", "-x", "A", "-x", "PATH", "-x",
                    "RINGFLOW_JOB_TOKEN", "-x", "B=2", *tail, "prog"]
    assert mpirun_argv(plan, {}, as_root=True)[:2] == ["mpirun", "--allow-run-as-root"]
    assert plan.hosts == ("h1", "h2") and plan.host_of(1) == "h2"


def test_exported_names_and_values_read_x_options_only():
    options = ["-x", "A=1", "--mca", "btl", "self", "-x", "B", "-x", "C=x=y", "-H", "D=1"]
    assert exported_names(options) == {"A", "B", "C"}
    assert exported_values(options) == {"A": "1", "C": "x=y"}
    assert exported_names(["-x"]) == set() and exported_values([]) == {}
