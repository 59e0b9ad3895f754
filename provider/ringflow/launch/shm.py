"""Removal of a job's shared-memory segments (`/dev/shm/ringflow-<job id>-*`) that a crashed
rank left behind; run by the launcher when a job ends and by its watchdog if it was killed.
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")


def job_segments(job_id: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    # job ids carry no '-' (env.resolve_identity), so this prefix matches this job only
    if not job_id or "-" in job_id or "/" in job_id:
        raise ValueError(f"job id {job_id!r} cannot name shm segments")
    if not shm_dir.is_dir():
        return []
    prefix = f"ringflow-{job_id}-"
    return sorted(p for p in shm_dir.iterdir() if p.name.startswith(prefix))


def sweep_job_segments(job_id: str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the job's segments; returns the names removed."""
    removed = []
    for path in job_segments(job_id, shm_dir):
        try:
            os.unlink(path)
            removed.append(path.name)
        except FileNotFoundError:
            pass  # a rank unlinked it in the meantime
    return removed
