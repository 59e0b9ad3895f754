"""What the tests learn through /proc: whether processes still run, and which processes
carry a test's marker in their environment (every descendant inherits it), so a test can
check that nothing it started outlived it; and a wait for such a state to come."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path


def _state(stat: str) -> str:
    return stat[stat.rfind(")") + 2]  # the name in parentheses may hold spaces


def alive(pids: Iterable[int]) -> list[int]:
    """The pids that still run (neither gone nor a zombie). A process that is exiting has
    dropped its memory (its environ reads empty) before it turns zombie: it counts here."""
    running = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if _state(stat) not in "ZX":
            running.append(pid)
    return running


def eventually(predicate: Callable[[], object], timeout: float = 10) -> bool:
    """Whether `predicate()` comes true within `timeout` seconds (looked at every 50 ms): a
    process ends, or its group empties, a little after what ends it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def marked_processes(var: str, value: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``var=value``."""
    needle = f"{var}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if _state((entry / "stat").read_text()) in "ZX":
                continue
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found
