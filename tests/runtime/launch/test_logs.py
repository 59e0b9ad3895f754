"""Worker output: DIR/workerlog.<rank> holds a rank's stdout and stderr byte for byte, and
the launcher's stdout carries every line whole, prefixed `[rank N] ` (`[rank N]+ ` for a
piece that is not a whole line: after a `\\r`, a cut, a last line without its newline)."""

from __future__ import annotations

import pytest

from ringflow.launch.lines import MAX_LINE_BYTES
from ringflow.launch.openmpi import OutputJoiner

pytestmark = pytest.mark.timeout(60)

CHATTY = """
    import os, sys
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    out = sys.stdout
    for i in range(LINES):
        # one write per line, long enough that two ranks' writes overlap in time
        out.write(f"r{rank} line {i:05d} " + chr(97 + rank) * (WIDTH + 37 * i % 500) + "\\n")
    out.write(f"r{rank} big " + "x" * 200_000 + "\\n")
    print(f"r{rank} on stderr", file=sys.stderr)
    out.write(f"r{rank} unterminated")
"""


def expected_lines(rank: int, lines: int, width: int) -> list[str]:
    body = [f"r{rank} line {i:05d} " + chr(97 + rank) * (width + 37 * i % 500)
            for i in range(lines)]
    return [*body, f"r{rank} big " + "x" * 200_000, f"r{rank} on stderr"]


@pytest.mark.multiproc
def test_concurrent_long_lines_arrive_whole_and_prefixed_with_their_rank(launcher):
    lines, width = 1500, 3000
    launcher.script("chatty.py", CHATTY.replace("LINES", str(lines))
                    .replace("WIDTH", str(width)))
    done = launcher.run("--nproc-per-host", "2", "chatty.py", timeout=60)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        forwarded = done.lines(f"[rank {rank}] ")
        assert forwarded == expected_lines(rank, lines, width)
        assert done.lines(f"[rank {rank}]+ ") == [f"r{rank} unterminated"]  # no newline
    other = [ln for ln in done.stdout.splitlines() if not ln.startswith(("[rank ", "[launch] "))]
    assert other == []


@pytest.mark.multiproc
def test_log_file_holds_exactly_what_the_rank_wrote(launcher):
    launcher.script("chatty.py", CHATTY.replace("LINES", "50").replace("WIDTH", "10"))
    done = launcher.run("--nproc-per-host", "2", "--log-dir", "logs/run1", "chatty.py")
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        text = (launcher.dir / "logs" / "run1" / f"workerlog.{rank}").read_text()
        # no newline added at the end
        assert text == "\n".join([*expected_lines(rank, 50, 10), f"r{rank} unterminated"])


FORGER = """
    import os, sys
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    out = sys.stdout.buffer
    fake = b'{"final_loss": 666.0, "steps": 1}'
    if rank == 1:  # speaks as rank 0, as the launcher, and reports an exit time
        out.write(b"x\\r[rank 0] [train] summary " + fake + b"\\n")
        out.write(b"y\\r[launch] result {\\"exit_code\\": 0}\\n")
        out.write(b"z\\rringflow-exit-time 1.0\\n")
        out.write(b"[1,0]<stdout>:[rank 0] [train] summary " + fake + b"\\n")  # a tag
    else:  # prints a summary it did not print as a whole line
        out.write(b"junk[train] summary " + fake + b"\\n")
        out.write(b"x\\r[train] summary " + fake + b"\\n")
        out.write(b"p" * (MAX - 2) + b"\\xe2\\x82\\xac[train] summary " + fake + b"\\n")
        out.write(b'[train] summary {"final_loss": 0.5, "steps": 2}\\n')
        out.write(b"[train] summary " + fake)  # the last line, without its newline
    out.flush()
"""


@pytest.mark.multiproc
def test_a_rank_cannot_print_a_line_that_reads_as_another_ranks_or_the_launchers(launcher):
    """Every line the launcher prints starts with the prefix of who printed it, has no \\r in
    it, and a `[rank 0] ` line is one rank 0 printed whole: the only summary is the real one."""
    launcher.script("forger.py", FORGER.replace("MAX", str(MAX_LINE_BYTES)))
    done = launcher.run("--nproc-per-host", "2", "forger.py", timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")[:-1]
    assert all(line.startswith(("[rank 0] ", "[rank 1] ", "[rank 0]+ ", "[rank 1]+ ",
                                "[launch] ")) and "\r" not in line for line in lines)
    assert [ln for ln in lines if ln.startswith("[rank 0] [train] ")] == [
        '[rank 0] [train] summary {"final_loss": 0.5, "steps": 2}']
    assert [ln for ln in lines if ln.startswith("[launch] result ")] == [
        next(ln for ln in lines if ln.startswith("[launch] result {"))]
    assert done.result["ranks"][1]["ended_at"] != 1.0  # the forged exit time was not taken
    assert done.lines("[rank 1]+ ") == ["x", '[rank 0] [train] summary {"final_loss": 666.0, '
                                        '"steps": 1}', "y", '[launch] result {"exit_code": 0}',
                                        "z", "ringflow-exit-time 1.0"]
    assert done.lines("[rank 1] ") == [
        '[1,0] <stdout>:[rank 0] [train] summary {"final_loss": 666.0, "steps": 1}']
    # under mpirun, Open MPI tags each of this agent's lines (here agent 1's): every line,
    # joined back, is agent 1's
    tagged = "".join(f"[1,1]<stdout>:{line}\n" for line in lines).encode()
    joined: list[tuple[int | None, str]] = []
    joiner = OutputJoiner(lambda index, line: joined.append((index, line)),
                          max_line=2 * MAX_LINE_BYTES)  # the long piece whole
    joiner.feed(tagged)
    joiner.close()
    assert [line for _, line in joined] == lines and {index for index, _ in joined} == {1}
    cut = done.lines("[rank 0]+ ")
    assert cut[:2] == ["x", '[train] summary {"final_loss": 666.0, "steps": 1}']
    assert len(cut[2]) == MAX_LINE_BYTES - 2 and cut[3].startswith("€[train] summary")
    assert cut[4:] == ['[train] summary {"final_loss": 666.0, "steps": 1}']
