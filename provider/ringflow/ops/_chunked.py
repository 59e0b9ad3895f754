"""Cache-sized chunks and a small thread pool for the elementwise optimizer updates.

An Adam step is a dozen in-place ufuncs over each parameter. Run over whole arrays, every
ufunc streams the parameter through main memory once; run over chunks that stay in L2, the
memory is streamed about once per array. numpy's ufuncs release the GIL, so disjoint ranges
of one array can be updated by several threads at once (the update is elementwise, so the
result does not depend on how the range is cut).

Threads: ``RINGFLOW_NUM_THREADS`` (default 1). The launcher sets it for every rank to the
rank's BLAS thread count, and sets ``OPENBLAS_THREAD_TIMEOUT=18``: in a training step the
update follows the backward GEMMs, after which OpenBLAS's idle workers spin for 2^28 cycles
(about 0.1 s) by default, so a second update thread would share its core with a spinning
one (measured on 2 cores: no gain at all); with 2^18 cycles they sleep after ~0.1 ms and
two update threads make Adam in the step 1.4-1.9x faster (README, "Parallel training
steps"). On an update run alone the pool is 1.3-1.9x faster.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Elements per chunk: 128 Ki float32 = 512 KiB per array. Measured on the project machine
# (Zen 3, 512 KiB L2, 32 MiB L3), Adam over 4.2 M and 54.6 M parameters: 32 Ki-element
# chunks lose more to per-call overhead (12 ufunc calls per chunk) than they win in L2
# hits; 1 Mi-element chunks fall out of cache. Measured again on a 1 MiB-L2 EPYC
# (2026-12-02): 64-256 Ki within noise of each other, 16 Ki 1.2-1.4x slower.
CHUNK = 131072
# Below this many elements a second thread costs more than it saves.
MIN_PARALLEL = 2 * CHUNK

_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_pool_size = 0
_pool_lock = threading.Lock()
_scratch = threading.local()


def num_threads() -> int:
    value = os.environ.get("RINGFLOW_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _get_pool(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_pid, _pool_size
    with _pool_lock:
        # A forked child inherits the pool object but not its threads: make a new one.
        if _pool is None or _pool_pid != os.getpid() or _pool_size < threads:
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ringflow-upd")
            _pool_pid, _pool_size = os.getpid(), threads
        return _pool


def scratch(n: int, dtype: np.dtype) -> np.ndarray:
    """A per-thread temporary of ``n`` elements (reused: contents are garbage)."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    buf = buffers.get(dtype)
    if buf is None or buf.size < n:
        buf = buffers[dtype] = np.empty(max(n, CHUNK), dtype)
    return buf[:n]


def for_each_chunk(n: int, body: Callable[[int, int], object]) -> list[object]:
    """Call ``body(start, stop)`` over ``[0, n)`` in chunks of at most ``CHUNK`` elements,
    spread over the update threads in contiguous ranges. Returns each range's results."""
    threads = min(num_threads(), max(1, n // MIN_PARALLEL))

    def run(lo: int, hi: int) -> list[object]:
        return [body(s, min(s + CHUNK, hi)) for s in range(lo, hi, CHUNK)]

    if threads <= 1:
        return run(0, n)
    # Range boundaries on chunk multiples, so each thread's chunks are full-sized.
    per = -(-n // threads // CHUNK) * CHUNK
    bounds = [(lo, min(lo + per, n)) for lo in range(0, n, per)]
    futures = [_get_pool(threads).submit(run, lo, hi) for lo, hi in bounds[1:]]
    results = run(*bounds[0])
    for f in futures:
        results.extend(f.result())
    return results
