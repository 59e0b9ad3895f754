"""A communication stream: one thread per ring that runs the collectives handed to it in
order, so an all-reduce goes on while the calling thread computes (CUDA streams, without a
GPU). Every wait has a deadline; an error in the thread reaches whoever waits."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import CommTimeoutError

# A job past the collective's own deadline (the comm timeout) by this much has a stuck
# thread, not a slow peer: the waiter gives up.
_GRACE_S = 30.0


class Handle:
    """One submitted job: ``wait`` returns when it has run, raising what it raised."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> None:
        if not self._done.wait(self.timeout_s + _GRACE_S):
            raise CommTimeoutError(f"{self.what} did not finish within "
                                   f"{self.timeout_s + _GRACE_S:.0f} s on its "
                                   f"communication thread")
        if self._error is not None:
            raise self._error


class CommStream:
    """Runs ``fn(*args)`` jobs one after another on a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0  # time spent running jobs (how much communication could hide)

    def submit(self, what: str, timeout_s: float, fn: Callable[..., Any], *args: Any) -> Handle:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        handle = Handle(what, timeout_s)
        self._jobs.put((handle, fn, args))
        return handle

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            handle, fn, args = job
            started, error = time.perf_counter(), None
            try:
                fn(*args)
            except BaseException as exc:  # handed to the waiter, which raises it
                error = exc
            self.busy_s += time.perf_counter() - started
            handle._finish(error)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread after the jobs already queued."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout_s)
            self._thread = None
