"""A failed mpirun job's shared memory swept on its hosts: `ringflow.launch.shm`'s sweep run
once on each host under mpirun, and one line per host of what it removed there.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence

from ringflow.launch.openmpi import TAGGED_LINE, one_per_host_argv

__all__ = ["SWEEP_TIMEOUT_S", "sweep_hosts"]

SWEEP_TIMEOUT_S = 30
_SWEEP = ("import sys\nfrom ringflow.launch.shm import sweep_job_segments\n"
          "removed = sweep_job_segments(sys.argv[1])\n"
          "print('removed shm segments ' + ' '.join(removed) if removed else "
          "'no shm segment of the job left')\n")


def sweep_hosts(job_id: str, hosts: Sequence[str], mpirun: str, global_args: Sequence[str],
                env: dict[str, str], say: Callable[[str], None]) -> None:
    """Remove the job's shared memory that killed ringflow workers left on each of `hosts`
    (one process per host, under mpirun with the job's `global_args`); best effort, within
    SWEEP_TIMEOUT_S. `say` gets what each host removed, or why the sweep did not finish."""
    argv = one_per_host_argv(mpirun, hosts, global_args, env,
                             [sys.executable, "-c", _SWEEP, job_id])
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=SWEEP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"shm sweep of job {job_id} on the hosts did not finish: {exc}")
        return
    for line in done.stdout.splitlines():
        match = TAGGED_LINE.match(line)
        if match and match.group(2) == "stdout":
            say(f"shm sweep on {hosts[int(match.group(1))]}: {match.group(3)}")
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        say(f"shm sweep of job {job_id} failed (exit {done.returncode}): {tail}")
