"""Worker output: DIR/workerlog.<rank> holds a rank's stdout and stderr byte for byte, and
the launcher's stdout carries every line whole, prefixed `[rank N] `."""

from __future__ import annotations

import pytest

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
    return [*body, f"r{rank} big " + "x" * 200_000, f"r{rank} on stderr",
            f"r{rank} unterminated"]


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
    other = [ln for ln in done.stdout.splitlines() if not ln.startswith(("[rank ", "[launch] "))]
    assert other == []


@pytest.mark.multiproc
def test_log_file_holds_exactly_what_the_rank_wrote(launcher):
    launcher.script("chatty.py", CHATTY.replace("LINES", "50").replace("WIDTH", "10"))
    done = launcher.run("--nproc-per-host", "2", "--log-dir", "logs/run1", "chatty.py")
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        text = (launcher.dir / "logs" / "run1" / f"workerlog.{rank}").read_text()
        assert text == "\n".join(expected_lines(rank, 50, 10))  # no newline added at the end
