"""Removal of a job's shared-memory segments (`/dev/shm/ringflow-<job id>-*`) that a crashed
rank left behind; run by the launcher when a job ends and by its watchdog if it was killed.
Only segments of this user, regular files, whose creating process is gone are removed: never
another user's file, a symlink, or a segment a live process still holds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ringflow.naming import shm_prefix

SHM_DIR = Path("/dev/shm")


def job_segments(job_id: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    prefix = shm_prefix(job_id)  # job ids carry no '-': this prefix matches this job only
    if not shm_dir.is_dir():
        return []
    return sorted(p for p in shm_dir.iterdir() if p.name.startswith(prefix))


def sweep_job_segments(job_id: str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the job's dead segments of this user; returns the names removed."""
    paths = job_segments(job_id, shm_dir)
    if not paths:  # a clean job: its ranks unlinked theirs; skip the transports' numpy import
        return []
    from ringflow.distributed.collective.transport.base import process_state
    from ringflow.distributed.collective.transport.shm import creator_pid

    removed = []
    for path in paths:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue  # a rank unlinked it in the meantime
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            continue
        holder = creator_pid(str(path))
        if holder > 0 and holder != os.getpid() and process_state(holder) not in (None, "Z", "X"):
            continue
        try:
            os.unlink(path)
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed
