"""Where a job's samples come from. The global batch of a step is a pure function of
(seed, step, global batch size) and the data, never of the layout or the target number of
steps, so every (mp, dp) split and every resume sees the same samples in the same order;
data-parallel rank r of dp feeds rows [r*B/dp, (r+1)*B/dp) of it."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ConfigError
from ..framework.program import Variable

# Mixed into the permutation seed, so the data order is not the parameters' random stream.
_ORDER_SALT = 0xDA7A


def local_rows(global_batch_size: int, dp_rank: int, dp_degree: int, micro: int = 0,
               micro_steps: int = 1) -> slice:
    """The rows of each global batch data-parallel rank ``dp_rank`` feeds (at micro-step
    ``micro`` of ``micro_steps``: the micro-batches split the batch in order, and each is
    split over the data-parallel ranks)."""
    per_micro = global_batch_size // micro_steps
    per = per_micro // dp_degree
    start = micro * per_micro + dp_rank * per
    return slice(start, start + per)


class SyntheticData:
    """The model's own seeded batches: rows ``rows`` of ``make_batch(seed, step, B)``."""

    def __init__(self, make_batch: Callable[[int, int, int], dict[str, np.ndarray]],
                 seed: int, global_batch_size: int) -> None:
        self.make_batch, self.seed, self.batch_size = make_batch, seed, global_batch_size

    def batch(self, step: int, rows: slice) -> dict[str, np.ndarray]:
        """``step`` counts steps done before this one (0 for the first)."""
        full = self.make_batch(self.seed, step, self.batch_size)
        return {name: value[rows] for name, value in full.items()}


class NpzData:
    """Samples of an ``.npz`` file whose arrays are named as the model's feeds (one row per
    sample, N rows each).

    The order: the samples of step s (0-based) are the consecutive sample numbers
    k = s*B .. s*B + B - 1 of an endless stream of epochs; sample k is row
    ``perm_e[k mod N]`` of epoch e = k // N, and ``perm_e`` is a permutation of the N rows
    seeded by (seed, e) only. So the global batch depends only on seed, s and B (and the
    file); a batch may span two epochs, and a file smaller than a batch is fine."""

    def __init__(self, path: str, arrays: dict[str, np.ndarray], seed: int,
                 global_batch_size: int) -> None:
        self.path, self.arrays = path, arrays
        self.seed, self.batch_size = seed, global_batch_size
        self.rows_total = len(next(iter(arrays.values())))
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, epoch, _ORDER_SALT])
            perm = rng.permutation(self.rows_total)
            self._perms = {epoch: perm, **{e: p for e, p in self._perms.items()
                                           if e == epoch - 1}}
        return perm

    def indices(self, step: int, rows: slice) -> np.ndarray:
        """The file rows that rows ``rows`` of step ``step``'s global batch are."""
        first = step * self.batch_size
        sample = np.arange(first + rows.start, first + rows.stop, dtype=np.int64)
        epochs, pos = np.divmod(sample, self.rows_total)
        out = np.empty_like(sample)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self.permutation(int(epoch))[pos[mask]]
        return out

    def batch(self, step: int, rows: slice) -> dict[str, np.ndarray]:
        index = self.indices(step, rows)
        return {name: value[index] for name, value in self.arrays.items()}


def open_npz(path: str, feeds: Mapping[str, Variable], seed: int,
             global_batch_size: int) -> NpzData:
    """Reads every feed's array from ``path`` and checks it against the feed variable:
    present, the same row count for all, a dtype that converts without changing kind, the
    feed's trailing shape. Arrays are converted to the feeds' dtypes once, here."""
    if not os.path.isfile(path):
        raise ConfigError(f"data {path!r}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = list(npz.files)
            missing = [name for name in feeds if name not in stored]
            if missing:
                raise ConfigError(f"data {path!r} has no array {missing[0]!r} (it has "
                                  f"{', '.join(stored) or 'none'}); the model feeds "
                                  f"{', '.join(feeds)}")
            arrays = {name: npz[name] for name in feeds}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"data {path!r} is not a readable .npz of numeric arrays: "
                          f"{exc}") from None
    converted = {name: _as_feed(path, name, arr, feeds[name]) for name, arr in arrays.items()}
    counts = {name: len(arr) for name, arr in converted.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise ConfigError(f"data {path!r}: the feeds' arrays must have the same number of "
                          f"rows, at least 1; got {counts}")
    return NpzData(path, converted, seed, global_batch_size)


def _as_feed(path: str, name: str, arr: np.ndarray, var: Variable) -> np.ndarray:
    want = np.dtype(var.dtype)
    if arr.ndim == 0 or not np.can_cast(arr.dtype, want, "same_kind"):
        raise ConfigError(f"data {path!r}: array {name!r} is {arr.dtype.name}"
                          f"{list(arr.shape)}; the feed is {want.name} of shape "
                          f"{list(var.shape or [])} (-1 = any)")
    shape = list(var.shape or [])
    if len(shape) != arr.ndim or any(d not in (-1, s) for d, s in zip(shape[1:],
                                                                     arr.shape[1:])):
        raise ConfigError(f"data {path!r}: array {name!r} has shape {list(arr.shape)}; the "
                          f"feed takes {shape} (-1 = any, the first dimension is the rows)")
    return np.ascontiguousarray(arr, dtype=want)
