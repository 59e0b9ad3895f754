"""10 MiB of a progress bar redrawn with \\r, for the streaming tests of a local job and of
an SSH stream: the script that writes it, and a line sink that checks every redraw arrives
as its own line while it samples this process's memory."""

from __future__ import annotations

from pathlib import Path

UPDATE = b"step %06d/100000 loss 0.123456 |" + b"#" * 60 + b"|\r"
COUNT = (10 << 20) // len(UPDATE % 0) + 1   # redraws: just over 10 MiB
SCRIPT = (
    "import sys\nout = sys.stdout.buffer\n"
    f"update = {UPDATE!r}\n"
    f"for start in range(0, {COUNT}, 1000):\n"
    f"    out.write(b''.join(update % i for i in range(start, min(start + 1000, {COUNT}))))\n"
    "out.flush()\n")


def rss_bytes() -> int:
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class Redraws:
    """The on_line sink: counts the lines and those that are not the next redraw, and the
    peak RSS every 2000 lines."""

    def __init__(self) -> None:
        self.lines = self.bad = self.peak = 0
        self.before = rss_bytes()

    def __call__(self, stream: str, line: str) -> None:
        if line != (UPDATE % self.lines).decode()[:-1]:
            self.bad += 1
        self.lines += 1
        if self.lines % 2000 == 0:
            self.peak = max(self.peak, rss_bytes())

    def growth(self) -> int:
        """How much this process's RSS grew from before the stream to its peak."""
        return max(self.peak, rss_bytes()) - self.before
