"""Where a job's samples come from. The global batch of a step is a pure function of
(seed, step, global batch size) and the data, never of the layout or the target number of
steps, so every (mp, dp) split and every resume sees the same samples in the same order;
data-parallel rank r of dp feeds rows [r*B/dp, (r+1)*B/dp) of it.

An ``.npz`` file is not read into memory: its members stored uncompressed (``np.savez``) are
memory-mapped (numpy's ``np.load(mmap_mode=...)`` does not map npz members, so the member's
data offset is read from the zip's local header and its .npy header), so a file larger than
the host's memory trains, each batch reading its rows; a compressed member
(``np.savez_compressed``) is read whole, and refused when it is larger than this rank's share
of the host's MemAvailable."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
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
                 global_batch_size: int, dtypes: Mapping[str, np.dtype] | None = None) -> None:
        self.path, self.arrays = path, arrays
        self.dtypes = {n: np.dtype((dtypes or {}).get(n, a.dtype)) for n, a in arrays.items()}
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
        """The rows, converted to the feeds' dtypes (the arrays may be memory-mapped: only
        these rows are read)."""
        index = self.indices(step, rows)
        return {name: np.ascontiguousarray(value[index], dtype=self.dtypes[name])
                for name, value in self.arrays.items()}


def open_npz(path: str, feeds: Mapping[str, Variable], seed: int,
             global_batch_size: int, memory_bytes: int | None = None) -> NpzData:
    """Opens every feed's array of ``path`` (memory-mapped where stored uncompressed; see the
    module docstring) and checks it against the feed variable: present, the same row count
    for all, a dtype that converts without changing kind, the feed's trailing shape. Rows
    are converted to the feeds' dtypes as batches read them. ``memory_bytes``: what a
    compressed member may take (default: MemAvailable over the ranks of this host)."""
    if not os.path.isfile(path):
        raise ConfigError(f"data {path!r}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            members = {info.filename[:-4]: info for info in archive.infolist()
                       if info.filename.endswith(".npy")}
            missing = [name for name in feeds if name not in members]
            if missing:
                raise ConfigError(f"data {path!r} has no array {missing[0]!r} (it has "
                                  f"{', '.join(members) or 'none'}); the model feeds "
                                  f"{', '.join(feeds)}")
            arrays = {name: _member(path, archive, members[name], memory_bytes)
                      for name in feeds}
    except (OSError, ValueError, zipfile.BadZipFile, struct.error) as exc:
        raise ConfigError(f"data {path!r} is not a readable .npz of numeric arrays: "
                          f"{exc}") from None
    for name, arr in arrays.items():
        _check_feed(path, name, arr, feeds[name])
    counts = {name: len(arr) for name, arr in arrays.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise ConfigError(f"data {path!r}: the feeds' arrays must have the same number of "
                          f"rows, at least 1; got {counts}")
    return NpzData(path, arrays, seed, global_batch_size,
                   {name: np.dtype(feeds[name].dtype) for name in arrays})


def _member(path: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo,
            memory_bytes: int | None) -> np.ndarray:
    """One .npy member: a read-only memmap if stored, else read whole if it fits."""
    name = info.filename[:-4]
    if info.compress_type == zipfile.ZIP_STORED:
        return _mapped(path, info)
    limit = _compressed_limit() if memory_bytes is None else memory_bytes
    if info.file_size > limit:
        raise ConfigError(
            f"data {path!r}: array {name!r} is stored compressed and takes "
            f"{info.file_size / 2**20:.1f} MiB once read, more than this rank may hold "
            f"({limit / 2**20:.1f} MiB: MemAvailable over the ranks of this host); store it "
            f"uncompressed (np.savez, not np.savez_compressed) and it is memory-mapped")
    with archive.open(info) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def _mapped(path: str, info: zipfile.ZipInfo) -> np.ndarray:
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise ValueError(f"member {info.filename!r}: no local file header")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        f.seek(start)
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(f"member {info.filename!r} holds Python objects")
    if offset - start + dtype.itemsize * math.prod(shape) > info.file_size:
        raise ValueError(f"member {info.filename!r} is shorter than its array "
                         f"{dtype.name}{list(shape)}")
    if not shape or 0 in shape:  # np.memmap cannot map zero bytes
        return np.zeros(shape, dtype)
    mapped = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                       order="F" if fortran else "C")
    # batches read rows in a random order: no read-ahead of the pages around each row
    with contextlib.suppress(AttributeError, OSError, ValueError):
        mapped._mmap.madvise(mmap.MADV_RANDOM)
    return mapped


def _compressed_limit() -> int:
    from .memory import mem_available

    ranks = int(os.environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    return mem_available() // max(ranks, 1)


def _check_feed(path: str, name: str, arr: np.ndarray, var: Variable) -> None:
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
