"""Worker: fleet.init reads the env contract; rank 1 leaves a marker file late, then both
ranks meet in fleet.barrier_worker, after which rank 0 must already see the marker."""

from __future__ import annotations

import os
import time
from pathlib import Path

import ringflow.distributed as dist
from ringflow.distributed import fleet

fleet.init(is_collective=True)
rank = fleet.worker_index()
marker = Path(f"{os.environ['RINGFLOW_JOB_ID']}.rank1-arrived")
if rank == 1:
    time.sleep(0.5)  # rank 0 reaches the barrier first and must wait there
    marker.touch()
fleet.barrier_worker()
print(f"rank {rank} of {fleet.worker_num()} endpoints {fleet.worker_endpoints(to_string=True)}"
      f" marker seen {marker.exists()}", flush=True)
dist.destroy_process_group()
