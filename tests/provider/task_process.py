"""An operator's `execute` in a task process of its own, as an Airflow worker runs it, so a
test can SIGKILL that process mid-job (a worker that dies) and look at what is left."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.airflow_env import REPO

SCRIPT = """
from {module} import {name}
from tests.provider.contexts import TaskInstanceStub

class Echo:
    def _say(self, msg, *args, **kwargs):
        print(msg % args if args else msg, flush=True)

    debug = info = warning = error = exception = _say

op = {name}(**{args!r})
op._cached_logger = Echo()
op.execute({{"ti": TaskInstanceStub({dag!r}, {task!r}, {run_id!r}, 1, max_tries={tries})}})
"""


def start(folder: Path, operator: type, args: dict, dag: str, run_id: str,
          max_tries: int = 1) -> subprocess.Popen:
    """The task process: `operator(**args).execute` of try 1 (a retry may follow unless
    `max_tries` is 0), its log on stdout."""
    script = folder / f"task-{uuid.uuid4().hex[:6]}.py"
    script.write_text(SCRIPT.format(module=operator.__module__, name=operator.__name__,
                                    args=args, dag=dag, task=args["task_id"], run_id=run_id,
                                    tries=max_tries))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def wait_for_line(proc: subprocess.Popen, starts: str, timeout: float) -> list[str]:
    """Read the task's log until a line starts with `starts`; AssertionError with the last
    lines if it ends or `timeout` passes first (the deadline is checked between lines)."""
    import time

    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if line.startswith(starts):
            return seen
        if not line:
            break
    raise AssertionError(f"no line starting with {starts!r}:\n" + "".join(seen[-30:]))


def killed(folder: Path, operator: type, args: dict, dag: str, run_id: str, until: str,
           max_tries: int = 1, timeout: float = 90) -> None:
    """Try 1 in its own task process, SIGKILLed once its log shows a line starting with
    `until`."""
    proc = start(folder, operator, args, dag, run_id, max_tries)
    try:
        wait_for_line(proc, until, timeout)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
