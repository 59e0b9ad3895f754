"""How the launcher reads, from an mpirun job's own lines, that a host it gave up was frozen:
only a launcher line says so (a rank cannot forge one), and the read is linear in the line's
length (every line of a job's output passes through it)."""

from __future__ import annotations

import pytest

from ringflow.launch.leftovers import FROZEN_WORDS, GIVEN_UP_WORDS, frozen_given_up_host

SAID = "stopped 6 process(es) of the job; 6 of them were " + FROZEN_WORDS


@pytest.mark.parametrize("line,host", [
    (f"[launch] mpirun: 10.77.0.3 {GIVEN_UP_WORDS}: {SAID}", "10.77.0.3"),
    (f"[launch] mpirun: node-b.example {GIVEN_UP_WORDS}: {SAID}", "node-b.example"),
    (f"[launch] mpirun: 10.77.0.3 {GIVEN_UP_WORDS}: stopped 6 process(es) of the job", None),
    (f"[launch] mpirun: 10.77.0.3 (after the stop): {SAID}", None),
    (f"[rank 0] [launch] mpirun: 10.77.0.3 {GIVEN_UP_WORDS}: {SAID}", None),   # a rank's line
    (f"[launch] {GIVEN_UP_WORDS}: {SAID}", None),                             # no host named
])
def test_only_a_launcher_line_naming_a_host_given_up_and_frozen_counts(line, host):
    assert frozen_given_up_host(line) == host


def test_long_lines_without_spaces_are_read():
    """A regular expression like `(\\S+) \\(given up\\)` searched in 64 KiB without a space
    backtracks from every start: hours for these lines, which the suite's per-test timeout
    would stop; this read is linear in the line's length."""
    lines = ["[launch] " + "x" * 2**16 + f" {FROZEN_WORDS}", "[launch] " + "x" * 2**20,
             "[launch] " + f"a {GIVEN_UP_WORDS}:" * 2**14 + FROZEN_WORDS,
             "[launch] mpirun: " + "h" * 2**16 + f" {GIVEN_UP_WORDS}: {SAID}"]
    assert [frozen_given_up_host(line) for line in lines] == [None, None, None, "h" * 2**16]
