"""How the launcher reads, from an mpirun job's own lines, that a host it gave up was frozen
or that mpirun lost a host's daemon: only a launcher line says so (a rank cannot forge one),
and the read is linear in the line's length (every line of a job's output passes through
it)."""

from __future__ import annotations

import pytest

from ringflow.launch.leftovers import (
    DAEMON_LOST_TAG,
    FROZEN_WORDS,
    GIVEN_UP_WORDS,
    daemon_lost_host,
    frozen_given_up_host,
)
from ringflow.launch.openmpi import lost_daemon_node

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


@pytest.mark.parametrize("line,host", [
    (f"[launch] mpirun: 10.77.0.3 {DAEMON_LOST_TAG}: Open MPI's daemon there went away",
     "10.77.0.3"),
    (f"[rank 2] [launch] mpirun: 10.77.0.3 {DAEMON_LOST_TAG}: forged", None),
    ("[launch] mpirun: 10.77.0.3 (given up): stopped 6 process(es) of the job", None),
])
def test_only_a_launcher_line_names_a_host_whose_daemon_mpirun_lost(line, host):
    assert daemon_lost_host(line) == host


def test_the_mpirun_report_of_a_lost_daemon_names_its_node_and_nothing_else():
    """Two ways mpirun's output says a daemon went: its own report naming the node, or (when
    it only says it was "unable to reliably start one or more daemons") OpenSSH's line."""
    said = ["ORTE has lost communication with a remote daemon.", "",
            "  HNP daemon   : [[43985,0],0] on node rf13032s1h0",
            "  Remote daemon: [[43985,0],1] on node 10.144.72.3", "",
            "Connection to 10.144.72.4 closed by remote host.",
            "ORTE was unable to reliably start one or more daemons.",
            "Connection to 10.144.72.5 closed."]
    found = [node for line in said if (node := lost_daemon_node(line)) is not None]
    assert found == ["10.144.72.3", "10.144.72.4"]
