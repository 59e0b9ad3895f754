"""``python -m ringflow.launch.digest PATH``: the SHA-256 of a data file or folder, as the
provider computes it before shipping data to a host (``ship_data``) and the host after: the
same function on both sides. A folder's digest covers each file's path relative to it and
its bytes, in the order a job reads them (``ringflow.train.text.text_files``)."""

from __future__ import annotations

import hashlib
import os
import sys

_CHUNK = 1 << 20


def data_files(path: str) -> list[str]:
    """The files of ``path`` (itself, or a folder's files as a job reads them)."""
    from ringflow.train.text import text_files

    return text_files(path)


def digest(path: str) -> str:
    """The hex SHA-256 of ``path``'s files: relative path, size and bytes of each."""
    h = hashlib.sha256()
    root = path if os.path.isdir(path) else os.path.dirname(path)
    for name in data_files(path):
        rel = os.path.relpath(name, root) if os.path.isdir(path) else os.path.basename(name)
        h.update(f"{rel}\0{os.path.getsize(name)}\0".encode())
        with open(name, "rb") as f:
            for chunk in iter(lambda f=f: f.read(_CHUNK), b""):
                h.update(chunk)
    return h.hexdigest()


def main(argv: list[str]) -> int:
    from ringflow.errors import ConfigError

    if len(argv) != 1:
        print("usage: python -m ringflow.launch.digest PATH", file=sys.stderr)
        return 2
    try:
        print(digest(argv[0]))
    except (ConfigError, OSError) as exc:
        print(f"ringflow.launch.digest: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
