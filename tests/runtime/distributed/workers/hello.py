"""Worker: one all-reduce and one line with the result (for launcher and env-style tests)."""

from __future__ import annotations

import numpy as np

import ringflow.distributed as dist

dist.init_parallel_env()
x = np.full(100003, dist.get_rank() + 1.0, dtype=np.float32)
dist.all_reduce(x)
comm = dist.get_ring(dist.get_group().id)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {x[0]:g} transport {comm.transport}"
      f" listens {comm.endpoints[comm.rank]}", flush=True)
dist.destroy_process_group()
