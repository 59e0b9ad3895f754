"""Lines to text streams, written by one thread, so that whoever produces them (the pumps of
mpirun's pipes) never blocks on a slow reader while the job is being stopped.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import IO

QUEUE_LINES = 10000  # lines waiting for a slow reader before their producer is held back
PUT_POLL_S = 0.2


class LineWriter:
    """Queues (stream, line) pairs for a writer thread.

    While `stopping()` is false a full queue holds the producer back (no line is lost);
    once it is true, or the writer is closed, a line that finds the queue full is dropped
    and counted: mpirun's pipes must always be drained, or mpirun would block writing and
    could not stop its processes. A stream whose reader went away (a closed SSH channel)
    is skipped from then on.
    """

    def __init__(self, stopping: Callable[[], bool], max_lines: int = QUEUE_LINES) -> None:
        self._stopping = stopping
        self._queue: queue.Queue[tuple[IO[str], str] | None] = queue.Queue(max_lines)
        self._closed = False
        self._gone: set[IO[str]] = set()
        self.dropped = 0
        # started by start(): no thread may exist at a fork with a preexec_fn
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ringflow-mpirun-output")

    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def write(self, stream: IO[str], line: str) -> None:
        while True:
            try:
                self._queue.put((stream, line), timeout=PUT_POLL_S)
                return
            except queue.Full:
                if self._stopping() or self._closed:
                    self.dropped += 1
                    return

    def close(self, timeout_s: float) -> None:
        """The queued lines written, within `timeout_s` (twice: to queue the end, to join)."""
        self.start()
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            stream, line = item
            if stream in self._gone:
                continue
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):  # whoever read it is gone
                self._gone.add(stream)
