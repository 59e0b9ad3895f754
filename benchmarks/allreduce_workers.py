"""Worker side of benchmarks/allreduce.py: one process per rank runs one backend over all sizes
and rank 0 prints one JSON line per size. Backends: ringflow (shm or TCP, per
RINGFLOW_TRANSPORT; ringflow-inplace: the buffers from comm.shared_array), gloo
(torch.distributed), mpi (mpi4py under mpirun), and the two limits:
memcpy (every rank copies at once) and tcpstream (a raw two-way socket stream).

Timing (same for every backend): per size one correctness check, 3 warm-up ops, then 9 timed
batches of k back-to-back in-place float32 SUM all-reduces (k agreed by all ranks so a batch
lasts ~30 ms), each started after a barrier; time per op = slowest rank's batch time / k;
reported = median over batches.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time

import numpy as np

BATCHES, WARMUP, BATCH_SECONDS = 9, 3, 0.03


def timed(op, buf, barrier, agree_max) -> tuple[float, int]:
    for _ in range(WARMUP):
        op(buf)
    start = time.perf_counter()
    op(buf)
    one = time.perf_counter() - start
    k = int(agree_max(max(1, min(10_000, int(BATCH_SECONDS / max(one, 1e-7))))))
    per_op = []
    for _ in range(BATCHES):
        barrier()
        start = time.perf_counter()
        for _ in range(k):
            op(buf)
        per_op.append(agree_max(time.perf_counter() - start) / k)
    return statistics.median(per_op), k


def run_sizes(label, rank, n, sizes, op, barrier, agree_max, extra=None, alloc=None) -> None:
    for size in sizes:
        buf = (alloc or (lambda count: np.empty(count, dtype=np.float32)))(size // 4)
        buf[:] = rank + 1
        op(buf)
        ok = bool(np.all(buf == n * (n + 1) / 2))
        buf[:] = 0
        t, k = timed(op, buf, barrier, agree_max)
        if rank == 0:
            algbw = size / t / 1e9
            print(json.dumps({"backend": label, "n": n, "size": size, "time_us": t * 1e6,
                              "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n, "k": k,
                              "correct": ok, **(extra or {})}), flush=True)


def _ringflow_world():
    """ringflow's process group, this rank, the world size, and a max over ranks."""
    import ringflow.distributed as dist

    dist.init_parallel_env()
    box = np.zeros(1)

    def agree_max(x):
        box[0] = x
        return dist.all_reduce(box, op=dist.ReduceOp.MAX)[0]

    return dist, dist.get_rank(), dist.get_world_size(), agree_max


def ringflow(sizes) -> None:
    dist, rank, n, agree_max = _ringflow_world()
    comm = dist.get_ring(dist.get_group().id)
    run_sizes(f"ringflow-{comm.transport}", rank, n, sizes, dist.all_reduce, dist.barrier,
              agree_max)
    dist.destroy_process_group()


def ringflow_inplace(sizes) -> None:
    """ringflow over shared memory with the buffers in shared memory (comm.shared_array)."""
    dist, rank, n, agree_max = _ringflow_world()
    comm = dist.get_ring(dist.get_group().id)
    run_sizes("ringflow-shm-inplace", rank, n, sizes, comm.all_reduce, dist.barrier, agree_max,
              alloc=lambda count: comm.shared_array(count, "float32"))
    dist.destroy_process_group()


def ringflow_shard(sizes) -> None:
    """all_reduce, reduce_scatter_v and all_gather_v (even parts) of the same buffers, plain
    and (on one host) from comm.shared_array: the sharded step's halves against the whole.
    busbw: all-reduce algbw * 2(n-1)/n, each half algbw * (n-1)/n (nccl-tests' rule)."""
    dist, rank, n, agree_max = _ringflow_world()
    comm = dist.get_ring(dist.get_group().id)
    kinds = [("", lambda count: np.empty(count, np.float32))]
    if comm.transport == "shm":
        kinds.append(("-inplace", lambda count: comm.shared_array(count, "float32")))
    for suffix, alloc in kinds:
        for size in sizes:
            buf = alloc(size // 4)
            bounds = [size // 4 * r // n for r in range(n + 1)]
            ops = {"all_reduce": (comm.all_reduce, 2),
                   "reduce_scatter": (lambda b, bd=bounds: comm.reduce_scatter_v(b, bd), 1),
                   "all_gather": (lambda b, bd=bounds: comm.all_gather_v(b, bd), 1)}
            for name, (op, factor) in ops.items():
                buf[:] = 0   # sums of zeros stay zero however often they repeat
                t, k = timed(op, buf, dist.barrier, agree_max)
                if rank == 0:
                    algbw = size / t / 1e9
                    print(json.dumps({"backend": f"ringflow-{comm.transport}{suffix}",
                                      "op": name, "n": n, "size": size, "time_us": t * 1e6,
                                      "algbw": algbw, "busbw": algbw * factor * (n - 1) / n,
                                      "k": k}), flush=True)
    dist.destroy_process_group()


def gloo(sizes) -> None:
    import torch
    import torch.distributed as tdist

    rank, n = int(os.environ["PADDLE_TRAINER_ID"]), int(os.environ["PADDLE_TRAINERS_NUM"])
    tdist.init_process_group("gloo", init_method=f"tcp://{os.environ['BENCH_MASTER']}",
                             rank=rank, world_size=n)
    box = torch.zeros(1, dtype=torch.float64)

    def agree_max(x):
        box[0] = x
        tdist.all_reduce(box, op=tdist.ReduceOp.MAX)
        return float(box[0])

    def op(buf):
        tdist.all_reduce(torch.from_numpy(buf))

    run_sizes("gloo", rank, n, sizes, op, tdist.barrier, agree_max,
              {"version": torch.__version__})
    tdist.destroy_process_group()


def mpi(sizes) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    label = os.environ.get("BENCH_LABEL", "mpi")

    def op(buf):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    run_sizes(label, comm.Get_rank(), comm.Get_size(), sizes, op, comm.Barrier,
              lambda x: comm.allreduce(x, op=MPI.MAX),
              {"version": MPI.Get_library_version().split(",")[0]})


def memcpy(sizes) -> None:
    """Bandwidth of np.copyto with every rank copying at once (a shared-memory bound)."""
    dist, rank, n, agree_max = _ringflow_world()
    for size in sizes:
        src, dst = np.ones(size // 4, np.float32), np.zeros(size // 4, np.float32)
        t, _ = timed(lambda _b, s=src, d=dst: np.copyto(d, s), None, dist.barrier, agree_max)
        if rank == 0:
            print(json.dumps({"backend": "memcpy", "n": n, "size": size, "time_us": t * 1e6,
                              "algbw": size / t / 1e9, "busbw": size / t / 1e9}), flush=True)
    dist.destroy_process_group()


def tcpstream(sizes) -> None:
    """Two ranks stream `size` bytes to each other at once over one socket pair (loopback):
    per-direction GB/s, what a 2-rank TCP all-reduce could at best reach as busbw."""
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    host, port = os.environ["BENCH_MASTER"].split(":")
    if rank == 0:
        srv = socket.create_server((host, int(port)))
        conn, _ = srv.accept()
    else:
        for _ in range(600):  # rank 0 may not listen yet
            try:
                conn = socket.create_connection((host, int(port)), timeout=60)
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for size in sizes:
        out, inb = np.ones(size, np.uint8), np.empty(size, np.uint8)
        best = []
        for _ in range(5):
            conn.sendall(b"s")
            conn.recv(1)
            start = time.perf_counter()
            sender = threading.Thread(target=conn.sendall, args=(memoryview(out),))
            sender.start()
            view, got = memoryview(inb), 0
            while got < size:
                got += conn.recv_into(view[got:])
            sender.join()
            best.append(time.perf_counter() - start)
        t = statistics.median(best)
        if rank == 0:
            print(json.dumps({"backend": "tcpstream", "n": 2, "size": size, "time_us": t * 1e6,
                              "algbw": size / t / 1e9, "busbw": size / t / 1e9}), flush=True)
    conn.close()


if __name__ == "__main__":
    backend, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    {"ringflow": ringflow, "ringflow-inplace": ringflow_inplace, "gloo": gloo, "mpi": mpi,
     "ringflow-shard": ringflow_shard,
     "memcpy": memcpy, "tcpstream": tcpstream}[backend](sizes)
