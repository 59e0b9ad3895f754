"""Worker: data-parallel training (fleet's default, on every rank) of a model with a
parameter the loss does not use, with ``find_unused_parameters`` argv[1] ("0"/"1") and
``use_hierarchical_allreduce`` argv[2] ("on", "off", or "unset": not assigned); writes the
parameters after 3 steps and the all-reduce algorithm of ring 0 to rank<N>.npz. The unused
parameter's gradient does not exist on any rank, so no rank waits on an all-reduce of it."""

from __future__ import annotations

import sys

import numpy as np

import ringflow as rf
from ringflow.distributed import fleet, get_ring
from ringflow.framework.layer_helper import create_parameter

fleet.init(is_collective=True)
main, startup = rf.Program(), rf.Program()
startup.random_seed = 5
with rf.program_guard(main, startup):
    x = rf.data("x", shape=[-1, 4], dtype="float64")
    used = rf.nn.fc(x, 3, weight_attr=rf.ParamAttr(name="used.w"))
    create_parameter([4, 3], "float64", attr=rf.ParamAttr(name="unused.w"))
    loss = rf.nn.mean(rf.nn.relu(used))
    strategy = fleet.DistributedStrategy()
    strategy.find_unused_parameters = sys.argv[1] == "1"
    if sys.argv[2] != "unset":
        strategy.use_hierarchical_allreduce = sys.argv[2] == "on"
    fleet.distributed_optimizer(rf.optimizer.Adam(0.01), strategy).minimize(loss)
scope, exe = rf.Scope(), rf.Executor()
exe.run(startup, scope=scope)
start = np.array(scope["unused.w"])
per = 4 // fleet.worker_num()
for step in range(3):
    rows = np.random.default_rng(step).standard_normal((4, 4))
    mine = rows[per * fleet.worker_index():per * (fleet.worker_index() + 1)]
    exe.run(main, feed={"x": mine}, fetch_list=[loss], scope=scope)
np.savez(f"rank{fleet.worker_index()}.npz", start=start, unused=np.array(scope["unused.w"]),
         used=np.array(scope["used.w"]), algorithm=np.array(get_ring(0).algorithm_name))
