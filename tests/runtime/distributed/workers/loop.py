"""Worker: all-reduce a 2 MiB buffer in a loop until something fails. Writes ready.<rank>
after a few rounds; on CommError prints it on one line and exits 17. Once everyone is ready,
with `raise-on-1` rank 1 raises ValueError, with `skip-on-1` rank 1 stops calling collectives
(sleeps, alive and heartbeating)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import ringflow.distributed as dist
from ringflow.errors import CommError


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "loop"
    try:
        dist.init_parallel_env()
    except CommError as exc:
        print(f"CommError: {exc}", flush=True)
        sys.exit(17)
    rank, n = dist.get_rank(), dist.get_world_size()
    buf = np.ones(1 << 19, dtype=np.float32)
    i = 0
    try:
        while True:
            dist.all_reduce(buf)
            buf[:] = 1.0
            i += 1
            if i == 3:
                Path(f"ready.{rank}").touch()
            if mode != "loop" and rank == 1 and i > 3 and all(
                    Path(f"ready.{r}").exists() for r in range(n)):
                if mode == "skip-on-1":
                    time.sleep(600)
                raise ValueError("rank 1 gives up on purpose")
    except CommError as exc:
        print(f"CommError at {time.time():.3f}: {exc}", flush=True)
        sys.exit(17)


if __name__ == "__main__":
    main()
