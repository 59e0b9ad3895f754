"""Seeds that are the same in every process and run: what initializers and random layers
derive from a program seed and a name (below the executor, which only reads them)."""

from __future__ import annotations

import zlib
from typing import Any


def stable_seed(*parts: Any) -> int:
    """A 32-bit seed from strings and ints that is the same in every process and run."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF
