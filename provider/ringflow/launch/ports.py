"""The ports ringflow picks for a job's ranks when none are given: a contiguous range below
the host's ephemeral range (the kernel's ip_local_port_range, where outgoing connections take
their local ports, so no connection made before the ranks listen can hold one of them),
checked by binding every port of it.

`python -m ringflow.launch.ports range` prints this host's ephemeral range (``LOW HIGH``);
`python -m ringflow.launch.ports check BASE COUNT` binds BASE..BASE+COUNT-1 and prints
``free`` (exit 0) or ``busy PORT: why`` (exit 1): what a launcher asks each host over SSH.
"""

from __future__ import annotations

import random
import socket
import sys
from contextlib import ExitStack

from ringflow.errors import LaunchError

__all__ = ["EPHEMERAL_FILE", "base_window", "busy_port", "ephemeral_range", "pick_base_port"]

EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, when the file cannot be read
PREFERRED_FLOOR = 20000  # below it sit many services' well-known ports
LOWEST = 1024  # a host whose ephemeral range starts low: anything unprivileged below it
TRIES = 8


def ephemeral_range(path: str = EPHEMERAL_FILE) -> tuple[int, int]:
    try:
        with open(path) as f:
            low, high = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def base_window(count: int, ephemeral_low: int, where: str = "this host") -> tuple[int, int]:
    """The first and last base port such that `count` ports from it lie below
    `ephemeral_low` (PREFERRED_FLOOR and up when there is room, else LOWEST and up);
    LaunchError when there is no such range."""
    last = ephemeral_low - count
    first = PREFERRED_FLOOR if last > PREFERRED_FLOOR else LOWEST
    if last < first:
        raise LaunchError(f"no {count} ports fit between {LOWEST} and the ephemeral range of "
                          f"{where} (from {ephemeral_low}, {EPHEMERAL_FILE}); pass a base "
                          f"port")
    return first, last


def busy_port(base: int, count: int) -> str | None:
    """None when every port of base..base+count-1 binds on all addresses (as the ranks
    will), else ``PORT: why`` for the first that does not. The sockets are held together
    and closed before the ranks bind."""
    with ExitStack() as stack:
        for port in range(base, base + count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("", port))
            except OSError as exc:
                return f"{port}: {exc.strerror or exc}"
    return None


def pick_base_port(count: int, rng: random.Random | None = None,
                   path: str = EPHEMERAL_FILE) -> int:
    """A base port of `count` ports free on this host, below its ephemeral range."""
    rng = rng or random.Random()
    low, high = ephemeral_range(path)
    first, last = base_window(count, low)
    for _ in range(TRIES):
        base = rng.randint(first, last)
        if busy_port(base, count) is None:
            return base
    raise LaunchError(f"no range of {count} ports free below this host's ephemeral range "
                      f"({low}-{high}) after {TRIES} tries; pass a base port")


def main(argv: list[str]) -> int:
    if argv == ["range"]:
        low, high = ephemeral_range()
        print(f"{low} {high}")
        return 0
    if len(argv) == 3 and argv[0] == "check" and argv[1].isdigit() and argv[2].isdigit():
        busy = busy_port(int(argv[1]), int(argv[2]))
        print("free" if busy is None else f"busy {busy}")
        return 0 if busy is None else 1
    print("usage: python -m ringflow.launch.ports range | check BASE COUNT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
