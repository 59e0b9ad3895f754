"""`follow` and `stop` of a detached job (`python -m ringflow.launch.supervisor follow|stop`;
`run` and the supervisor itself are `ringflow.launch.supervisor`).

`follow` streams the job folder's output.log from an offset until the job ends, renewing the
lease while it runs (with `--tie`, it stops the job when its own stdin ends: the watcher is
gone), and says the job's final status in one line. `stop` asks the job's supervisor to stop
it, continuing a frozen job so that it can; where no supervisor lives it kills what is left
of the job. The folder's layout is `jobdir`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import stat
import sys
import time
from pathlib import Path

from ringflow.launch import jobdir
from ringflow.launch.exits import LOST_EXIT
from ringflow.launch.leftovers import FROZEN_WORDS, processes_with_env
from ringflow.launch.processes import stopped_processes

FINAL_PREFIX = "ringflow-job-status "  # the last line `follow` prints (on stderr)
RENEW_S = 1.0            # `follow --renew`: how often
TICK_S = 0.2
READ_BYTES = 1 << 20


def marked_processes(marker: str) -> list[int]:
    """Live processes of this user (but this one) carrying the job's marker
    (`jobdir.MARKER_VAR`)."""
    return processes_with_env(jobdir.MARKER_VAR, marker, exclude={os.getpid()})


def follow_main(ns: argparse.Namespace) -> int:
    """Copy output.log from --offset to stdout as it grows; end with the job (exit code the
    job's, LOST_EXIT if its supervisor vanished) or when stdin ends (the watcher is gone)."""
    job_dir = ns.job_dir.expanduser()
    offset = max(0, ns.offset)
    next_renew = 0.0
    stdin_open = _stdin_is_watchable()
    while True:
        if ns.renew and time.monotonic() >= next_renew:
            with contextlib.suppress(OSError):
                jobdir.renew_lease(job_dir)
            next_renew = time.monotonic() + RENEW_S
        look = jobdir.peek(job_dir, offset, READ_BYTES)
        ended = look.state in (jobdir.ENDED, jobdir.LOST)
        data = look.data
        if ended and not data and offset < look.size:  # a lost job's last, unended line
            data = _read_raw(job_dir, offset, READ_BYTES)
        if data:
            if not _write_out(data):  # the watcher is gone (its end of stdout closed)
                return _watcher_gone(ns, job_dir)
            offset += len(data)
            continue
        if ended:
            return _final(look, offset)
        if stdin_open and _stdin_ended(TICK_S):
            return _watcher_gone(ns, job_dir)
        if not stdin_open:
            time.sleep(TICK_S)


def _watcher_gone(ns: argparse.Namespace, job_dir: Path) -> int:
    """A tied job is stopped with its watcher; an untied one runs on (its lease, if any,
    decides the rest)."""
    if ns.tie:
        request_stop(job_dir, "the watcher that tied the job to itself is gone")
    return 0


def _read_raw(job_dir: Path, offset: int, limit: int) -> bytes:
    with open(job_dir / jobdir.OUTPUT, "rb") as f:
        f.seek(offset)
        return f.read(limit)


def _write_out(data: bytes) -> bool:
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except (BrokenPipeError, OSError):
        return False
    return True


def _final(look: jobdir.Peek, offset: int) -> int:
    status = dict(look.status or {})
    status["state"] = look.state
    status["offset"] = offset
    with contextlib.suppress(OSError):
        print(FINAL_PREFIX + json.dumps(status, sort_keys=True), file=sys.stderr, flush=True)
    if look.state == jobdir.LOST:
        return LOST_EXIT
    code = status.get("exit_code")
    return code if isinstance(code, int) and 0 <= code < 256 else 1


def _stdin_is_watchable() -> bool:
    """stdin is a pipe or socket (a watcher's lifeline), not /dev/null or a terminal."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _stdin_ended(timeout_s: float) -> bool:
    ready, _, _ = select.select([0], [], [], timeout_s)
    if not ready:
        return False
    try:
        return not os.read(0, 65536)
    except OSError:
        return True


def request_stop(job_dir: Path, why: str) -> str:
    """Ask the supervisor to stop the job (it records `why`); if no supervisor lives, stop
    what is left of the job here. Returns what was done."""
    status = jobdir.read_status(job_dir)
    if status is None:
        return f"no job in {job_dir}"
    if status.get("state") == jobdir.ENDED:
        return f"the job in {job_dir} has ended already ({status.get('cause')})"
    with contextlib.suppress(OSError):
        fd = os.open(job_dir / jobdir.STOP, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(why[:500] + "\n")
    pid = status.get("supervisor_pid")
    marker = status.get("marker")
    left = marked_processes(marker) if isinstance(marker, str) and marker else []
    if jobdir.supervisor_alive(job_dir) and isinstance(pid, int) and pid > 1:
        # a frozen job (SIGSTOP: the host's processes halted) cannot act on the request:
        # continue it, so the supervisor stops it and its ranks can end
        frozen = stopped_processes([pid, *left])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            for stopped in frozen:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(stopped, signal.SIGCONT)
            said = f"asked the supervisor (pid {pid}) to stop the job: {why}"
            if frozen:
                said += (f"; {len(frozen)} of its {len(left) + 1} processes were {FROZEN_WORDS}"
                         ", continued so that they can end")
            return said
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return (f"no supervisor runs for {job_dir}; killed {len(left)} process(es) left of the job"
            if left else f"no supervisor runs for {job_dir} and nothing of the job is left")


def stop_main(ns: argparse.Namespace) -> int:
    job_dir = ns.job_dir.expanduser()
    print(request_stop(job_dir, ns.why), flush=True)
    deadline = time.monotonic() + max(0.0, ns.wait)
    while time.monotonic() < deadline and jobdir.supervisor_alive(job_dir):
        time.sleep(0.05)
    return 0
