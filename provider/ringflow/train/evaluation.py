"""Validation: the mean loss over every scored position of every validation sample (and a
classifier's accuracy), the same at every layout. The samples go in global batches of the
job's size, data-parallel rank r feeding its rows of each (as in training); the last batch
is filled up with samples from the start, which are fed but not counted. Each rank sums
the losses of its counted positions, and the sums (loss, positions, correct) are
all-reduced over the data-parallel ring, so the result does not depend on how the samples
were split, up to the rounding of the sums' order."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .data import EvalSet


class Evaluator:
    """Runs ``program`` (a ``clone(for_test=True)`` of the job's main program: no backward,
    no update, dropout off) over ``evals``. ``reduce`` sums a float64 array over the
    data-parallel ranks in place (None: one rank holds every row)."""

    def __init__(self, program, outputs: dict[str, str], evals: EvalSet,
                 global_batch_size: int, rows: slice,
                 reduce: Callable[[np.ndarray], None] | None = None) -> None:
        self.program, self.evals = program, evals
        self.batch_size, self.rows, self.reduce = global_batch_size, rows, reduce
        self.loss_name = outputs["sample_loss"]
        self.labels = outputs.get("labels")
        self.fetch = [self.loss_name] + ([outputs["logits"]] if self.labels else [])

    def run(self, exe, scope) -> dict[str, float]:
        """``{"val_loss": ...}`` and, for a classifier, ``"val_accuracy"``."""
        totals = np.zeros(3, dtype=np.float64)   # loss sum, positions, correct rows
        count, size = self.evals.count, self.batch_size
        batches = -(-count // size)
        # A NaN/inf is reported once, by the worker's check of the result, not per op.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for first in range(0, batches * size, size):
                self._batch(exe, scope, first, totals)
        if self.reduce is not None:
            self.reduce(totals)
        result = {"val_loss": float(totals[0] / totals[1])}
        if self.labels:
            result["val_accuracy"] = float(totals[2] / totals[1])
        return result

    def _batch(self, exe, scope, first: int, totals: np.ndarray) -> None:
        """Adds this rank's rows of the global batch starting at sample ``first``."""
        count = self.evals.count
        sample = np.arange(first + self.rows.start, first + self.rows.stop, dtype=np.int64)
        counted = sample < count
        feed = self.evals.take(sample % count)
        values = exe.run(self.program, feed=feed, fetch_list=self.fetch, scope=scope)
        losses = values[0].astype(np.float64).reshape(len(sample), -1)
        totals[0] += losses[counted].sum()
        totals[1] += counted.sum() * losses.shape[1]
        if self.labels:
            hits = np.argmax(values[1], axis=-1) == feed[self.labels].reshape(-1)
            totals[2] += np.count_nonzero(hits[counted])
