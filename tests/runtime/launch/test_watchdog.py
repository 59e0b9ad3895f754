"""The one job watchdog (`ringflow.launch.watchdog`) with real processes: when its owner is
SIGKILLed it stops the process groups it was told and every process carrying the job's
marker, but never a process above it; after `done` it stops nothing. The marker's value
travels on its stdin: it is on neither its command line nor in its environment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ringflow.launch.processes import live_groups
from ringflow.launch.watchdog import Orders, read_until_done
from tests import procs

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(60)]
REPO = Path(__file__).resolve().parents[3]
MARK_NAME = "RINGFLOW_TEST_JOB_MARK"
GRACE_S = 1.0
# The owner: starts the watchdog, a worker group (a leader and its child, told to the
# watchdog) and a marked process in a session of its own (not told: found by its marker);
# releases the watchdog when asked; prints the pids; then waits to be killed.
OWNER = f"""import json, os, subprocess, sys, time
from ringflow.launch.watchdog import WatchdogClient
value, release = sys.argv[1], sys.argv[2] == "release"
dog = WatchdogClient("wdtest", {GRACE_S}, marker=({MARK_NAME!r}, value))
group = subprocess.Popen(["sh", "-c", "sleep 50 & sleep 50; wait"], start_new_session=True,
                         env={{k: v for k, v in os.environ.items() if k != {MARK_NAME!r}}})
dog.watch_group(group.pid)
marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(50)"],
                          start_new_session=True, env={{**os.environ, {MARK_NAME!r}: value}})
if release:
    dog.release()
print(json.dumps({{"group": group.pid, "marked": marked.pid, "watchdog": dog.proc.pid,
                  "owner": os.getpid()}}), flush=True)
time.sleep(50)
"""
# Above the owner, carrying the marker: the watchdog must spare it.
ABOVE = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(50)"


@pytest.fixture
def job():
    """Starts (above -> owner -> watchdog, group, marked) and kills what is left after."""
    started: list[tuple[subprocess.Popen, dict]] = []

    def start(release: bool) -> tuple[subprocess.Popen, dict, str]:
        value = "mark-" + uuid.uuid4().hex
        env = {**os.environ, "PYTHONPATH": str(REPO / "provider"), MARK_NAME: value}
        above = subprocess.Popen([sys.executable, "-c", ABOVE, sys.executable, "-c", OWNER,
                                  value, "release" if release else "keep"], env=env,
                                 stdout=subprocess.PIPE, text=True, start_new_session=True)
        pids = json.loads(above.stdout.readline())
        started.append((above, pids))
        return above, pids, value

    yield start
    for above, pids in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pids["group"], signal.SIGKILL)
        for pid in (pids["marked"], pids["owner"], above.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        above.wait(10)
        above.stdout.close()


def test_a_sigkilled_owner_leaves_no_group_and_no_marked_process_but_spares_those_above(job):
    above, pids, value = job(release=False)
    dog = pids["watchdog"]
    assert value not in Path(f"/proc/{dog}/cmdline").read_text()
    assert value.encode() not in Path(f"/proc/{dog}/environ").read_bytes()
    assert live_groups([pids["group"]]) == {pids["group"]} and procs.alive([pids["marked"]])
    os.kill(pids["owner"], signal.SIGKILL)
    assert procs.eventually(lambda: not live_groups([pids["group"]]), 15), "the group outlived it"
    assert procs.eventually(lambda: not procs.alive([pids["marked"], dog]), 15)
    assert procs.alive([above.pid]) == [above.pid]  # marked, but above the watchdog


def test_after_done_the_watchdog_exits_and_stops_nothing(job):
    _, pids, _ = job(release=True)
    assert procs.eventually(lambda: not procs.alive([pids["watchdog"]]), 10)
    os.kill(pids["owner"], signal.SIGKILL)
    time.sleep(GRACE_S + 1)  # the grace a watchdog would have given them
    assert live_groups([pids["group"]]) == {pids["group"]}
    assert procs.alive([pids["marked"]]) == [pids["marked"]]


def test_the_orders_are_groups_markers_and_pids_to_spare_until_done():
    orders = read_until_done(io.BytesIO(
        b"pg 12\nenv RINGFLOW_JOB_TOKEN=a b=c\nspare 1 40\nenv 1X=y\nenv NOEQ\npg 13\n"
        b"done\npg 14\n"))
    assert orders == Orders(groups=[12, 13], markers=[("RINGFLOW_JOB_TOKEN", "a b=c")],
                            released=True, spared={1, 40})
    assert read_until_done(io.BytesIO(b"env A=1\n")).released is False
