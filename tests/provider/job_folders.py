"""What the tests hold a job's folders to on every host: folders 0700 and files 0600 (no
symlink), whatever the state folder's mode was before the job."""

from __future__ import annotations

import stat
from pathlib import Path


def loosen(folder: Path) -> None:
    """`folder` made (if missing) and opened to everyone's reading, as a state folder made by
    hand or by an older ringflow may be."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)


def not_private(folder: Path) -> list[str]:
    """Every entry of `folder` (itself included) that is not a 0700 folder or a 0600 file,
    with its mode."""
    wrong = []
    for path in [folder, *sorted(folder.rglob("*"))]:
        st = path.lstat()
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) != want:
            wrong.append(f"{path} {stat.S_IMODE(st.st_mode):o}")
    return wrong
