"""Data-parallel training of a small MLP, one replica per PopRun instance.

Runs under Graphcore's poprun as Paddle's IPU launcher starts it, or on CPU hosts under
`ringflow-poprun` (same command line): `fleet.init` reads the PADDLE_* variables the command
exports (PADDLE_TRAINERS_NUM, one PADDLE_TRAINER_ENDPOINTS entry per host, and per instance
PADDLE_TRAINER_ID, PADDLE_CURRENT_ENDPOINT, PADDLE_RANK_IN_NODE) and the job id and token
(PopRunOperator's ``ringflow_job=True``, or ringflow-poprun's own). Every instance trains on
its slice of each global batch; the gradients are averaged across instances, so the losses
are one process's on the whole batch. Rank 0 prints the global loss per step.

    python poprun_dp_train.py [--steps N] [--learning-rate LR] [--fail-rank R --fail-step S]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import ringflow as rf
import ringflow.distributed as dist

GLOBAL_BATCH = 16
FEATURES, HIDDEN, CLASSES = 8, 16, 4


def build(fleet, learning_rate: float = 0.1):
    main, startup = rf.Program(), rf.Program()
    startup.random_seed = 7  # every replica starts from the same weights
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, FEATURES], dtype="float64")
        y = rf.data("y", shape=[-1], dtype="int64")
        h = rf.nn.relu(rf.nn.fc(x, HIDDEN, weight_attr=rf.ParamAttr(name="fc1.w")))
        logits = rf.nn.fc(h, CLASSES, weight_attr=rf.ParamAttr(name="fc2.w"))
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))
        strategy = fleet.DistributedStrategy()
        strategy.tensor_parallel = True  # degree 1: data parallel over every rank
        strategy.tensor_parallel_configs = {"tensor_parallel_degree": 1}
        fleet.distributed_optimizer(rf.optimizer.SGD(learning_rate), strategy).minimize(loss)
    return main, startup, loss


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--fail-step", type=int, default=0)
    args = parser.parse_args(argv)

    fleet = rf.distributed.fleet
    fleet.init(is_collective=True)
    rank, world = fleet.worker_index(), fleet.worker_num()
    if GLOBAL_BATCH % world:
        print(f"rank {rank}: {world} replicas do not divide the batch of {GLOBAL_BATCH}")
        return 2
    print(f"rank {rank} of {world} at {fleet.worker_endpoints()[rank]}", flush=True)
    main_program, startup, loss = build(fleet, args.learning_rate)
    exe = rf.Executor()
    exe.run(startup)
    if world > 1:
        dist.init_parallel_env()  # the losses' average below
    part = GLOBAL_BATCH // world
    mine = slice(rank * part, (rank + 1) * part)
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_step:
            print(f"rank {rank}: failing at step {step} as asked", flush=True)
            return 3
        # each step's batch from its own seed: the same on every replica (each takes its
        # slice), and made as it is needed (a run of a million steps holds one batch)
        rng = np.random.default_rng([0, step])
        x = rng.standard_normal((GLOBAL_BATCH, FEATURES))
        y = rng.integers(0, CLASSES, size=GLOBAL_BATCH)
        value, = exe.run(main_program, feed={"x": x[mine], "y": y[mine]}, fetch_list=[loss])
        value = np.array(value, dtype=np.float64).reshape(-1)
        if world > 1:
            dist.all_reduce(value, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step} loss {value[0]:.12f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
