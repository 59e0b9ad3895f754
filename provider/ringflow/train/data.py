"""Where a job's samples come from. The global batch of a step is a pure function of
(seed, step, global batch size) and the data, never of the layout or the target number of
steps, so every (mp, dp) split and every resume sees the same samples in the same order;
data-parallel rank r of dp feeds rows [r*B/dp, (r+1)*B/dp) of it.

An ``.npz`` file is not read into memory: its members stored uncompressed (``np.savez``) are
memory-mapped (numpy's ``np.load(mmap_mode=...)`` does not map npz members, so the member's
data offset is read from the zip's local header and its .npy header), so a file larger than
the host's memory trains, each batch reading its rows; a compressed member
(``np.savez_compressed``) is read whole, and refused when it is larger than this rank's share
of the host's MemAvailable.

Kinds of ``data``: ``synthetic``, an ``.npz`` of arrays named as the feeds, a ``.csv`` of
features and a label (the MLP), an ``.npy`` token stream or a UTF-8 text file or folder
(the transformer: ``text.py``). The validation samples (``EvalSet``) are the file's
``validation_fraction`` (rows chosen by the seed; the text's tail) or ``eval_data``."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..framework.program import Variable
from . import text
from .text import Tokenizer

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


def read_csv(path: str, feeds: Mapping[str, Variable]) -> dict[str, np.ndarray]:
    """A CSV of numbers, one sample a row, an optional header line: the last column is the
    label (an integer class), the others the features; the model's two feeds, in order,
    take the features and the label."""
    if len(feeds) != 2:
        raise ConfigError(f"data {path!r}: a .csv feeds a model of two feeds (features, "
                          f"label); the model feeds {', '.join(feeds)}")
    try:
        with open(path, encoding="utf-8") as f:
            header = not _numbers(f.readline())
        table = np.loadtxt(path, delimiter=",", skiprows=int(header), ndmin=2,
                           dtype=np.float64, encoding="utf-8")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"data {path!r} is not a readable CSV of numbers: {exc}") from None
    if table.shape[1] < 2 or not len(table):
        raise ConfigError(f"data {path!r}: a CSV needs rows of features and a label, got "
                          f"{table.shape[0]} rows of {table.shape[1]} columns")
    labels = table[:, -1]
    if not np.all(labels == np.round(labels)):
        raise ConfigError(f"data {path!r}: the last column is the label, an integer class; "
                          f"it holds {labels[labels != np.round(labels)][0]!r}")
    x_name, y_name = feeds
    arrays = {x_name: table[:, :-1], y_name: labels.astype(np.int64)}
    for name, arr in arrays.items():
        _check_feed(path, name, arr, feeds[name])
    return {name: np.ascontiguousarray(arr, dtype=np.dtype(feeds[name].dtype))
            for name, arr in arrays.items()}


def _numbers(line: str) -> bool:
    try:
        [float(v) for v in line.strip().split(",")]
    except ValueError:
        return False
    return True


# text: windows of one token stream ---------------------------------------------------------
_WINDOW_SALT = 0x7E47
# Rows of the validation split of an array file: chosen by the seed, not the order's stream.
_SPLIT_SALT = 0x5B17


def windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int,
            names: tuple[str, str]) -> dict[str, np.ndarray]:
    """The windows of ``seq_len + 1`` tokens at ``starts``: the first ``seq_len`` feed
    ``names[0]``, the last ``seq_len`` (the next tokens) ``names[1]``."""
    index = starts.astype(np.int64)[:, None] + np.arange(seq_len + 1)
    window = np.asarray(tokens[index.reshape(-1)], dtype=np.int64).reshape(index.shape)
    return {names[0]: window[:, :-1].copy(), names[1]: window[:, 1:].copy()}


class TokenWindows:
    """Samples of one token stream (a text corpus, or a memory-mapped ``.npy``): step s's
    global batch is B windows of ``seq_len + 1`` tokens starting at offsets drawn by a
    generator seeded by (seed, s) only."""

    def __init__(self, tokens: np.ndarray, seq_len: int, names: tuple[str, str], seed: int,
                 global_batch_size: int) -> None:
        if len(tokens) < seq_len + 1:
            raise ConfigError(f"the training text is {len(tokens)} tokens, shorter than one "
                              f"sample of seq_len + 1 = {seq_len + 1}")
        self.tokens, self.seq_len, self.names = tokens, seq_len, names
        self.seed, self.batch_size = seed, global_batch_size

    def starts(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, step, _WINDOW_SALT])
        return rng.integers(0, len(self.tokens) - self.seq_len, self.batch_size)

    def batch(self, step: int, rows: slice) -> dict[str, np.ndarray]:
        return windows(self.tokens, self.starts(step)[rows], self.seq_len, self.names)


class EvalSet:
    """The validation samples in a fixed order: ``count`` of them, ``take(indices)`` their
    feeds; ``tokens_per_sample`` positions score each (seq_len for text, 1 for a row)."""

    def __init__(self, count: int, take: Callable[[np.ndarray], dict[str, np.ndarray]],
                 tokens_per_sample: int = 1) -> None:
        self.count, self.take, self.tokens_per_sample = count, take, tokens_per_sample


def token_eval_set(tokens: np.ndarray, seq_len: int, names: tuple[str, str]) -> EvalSet:
    """Consecutive windows, each starting where the previous one's inputs end, so every
    token but the first is predicted once."""
    count = (len(tokens) - 1) // seq_len
    if count < 1:
        raise ConfigError(f"the validation text is {len(tokens)} tokens, shorter than one "
                          f"sample of seq_len + 1 = {seq_len + 1}")
    return EvalSet(count, lambda k: windows(tokens, k * seq_len, seq_len, names), seq_len)


def array_eval_set(data: NpzData) -> EvalSet:
    """Every row of ``data`` in file order, converted to the feeds' dtypes as read."""
    return EvalSet(data.rows_total, lambda k: {
        name: np.ascontiguousarray(value[k], dtype=data.dtypes[name])
        for name, value in data.arrays.items()})


@dataclass
class Sources:
    """A job's training samples, its validation samples (None: no validation) and the
    tokenizer of its text (None for arrays and synthetic data)."""

    train: Any
    eval: EvalSet | None
    tokenizer: Tokenizer | None


def token_feeds(path: str, feeds: Mapping[str, Variable]) -> tuple[tuple[str, str], int]:
    """(names, seq_len) of a model that reads text: two int64 feeds of [-1, seq_len]."""
    shapes = [list(v.shape or []) for v in feeds.values()]
    if len(feeds) != 2 or any(len(s) != 2 or s[1] < 1 for s in shapes) or \
            shapes[0] != shapes[1] or any(np.dtype(v.dtype).kind not in "iu"
                                          for v in feeds.values()):
        raise ConfigError(f"data {path!r} is text (or a token stream), which trains a model "
                          f"fed tokens and labels, integers of [-1, seq_len] (the "
                          f"transformer); this model feeds "
                          + ", ".join(f"{n} {v.dtype}{list(v.shape or [])}"
                                      for n, v in feeds.items()))
    names = tuple(feeds)
    return (names[0], names[1]), shapes[0][1]


def is_arrays(path: str) -> bool:
    return path.endswith((".npz", ".csv"))


def open_arrays(path: str, feeds: Mapping[str, Variable], seed: int,
                global_batch_size: int) -> NpzData:
    """An ``.npz`` (memory-mapped where stored) or a ``.csv`` (read) as a job's data."""
    if path.endswith(".csv"):
        return NpzData(path, read_csv(path, feeds), seed, global_batch_size)
    return open_npz(path, feeds, seed, global_batch_size)


def open_data(spec, feeds: Mapping[str, Variable], make_batch,
              vocab_size: int | None) -> Sources:
    """The samples of ``spec`` (a JobSpec) for a model with these feed variables."""
    seed, batch = spec.seed, spec.global_batch_size
    if spec.data == "synthetic":
        evals, tok = None, None
        if spec.eval_data is not None:
            evals, tok = open_eval_set(spec.eval_data, feeds, spec.tokenizer, vocab_size)
        return Sources(SyntheticData(make_batch, seed, batch), evals, tok)
    if is_arrays(spec.data):
        train = open_arrays(spec.data, feeds, seed, batch)
        evals = None
        if spec.eval_data is not None:
            evals = array_eval_set(open_arrays(spec.eval_data, feeds, seed, batch))
        elif spec.validation_fraction:
            train, held = _split_rows(train, spec.validation_fraction)
            evals = array_eval_set(held)
        return Sources(train, evals, None)
    names, seq_len = token_feeds(spec.data, feeds)
    vocab = vocab_size or 1 << 62
    streams = [text.read_stream(spec.data, vocab)]
    if spec.eval_data is not None:
        streams.append(text.read_stream(spec.eval_data, vocab))
    tok = text.make_tokenizer(spec.tokenizer, streams, vocab)
    tokens = text.tokens_of(streams[0], tok)
    evals = None
    if spec.eval_data is not None:
        evals = token_eval_set(text.tokens_of(streams[1], tok), seq_len, names)
    elif spec.validation_fraction:
        held = round(len(tokens) * spec.validation_fraction)
        evals = token_eval_set(tokens[len(tokens) - held:], seq_len, names)
        tokens = tokens[:len(tokens) - held]
    return Sources(TokenWindows(tokens, seq_len, names, seed, batch), evals, tok)


def open_eval_set(path: str, feeds: Mapping[str, Variable], tokenizer: str | Tokenizer,
                  vocab_size: int | None) -> tuple[EvalSet, Tokenizer | None]:
    """Every sample of ``path`` as validation samples, text read with ``tokenizer`` (a
    kind, or a checkpoint's Tokenizer)."""
    if is_arrays(path):
        return array_eval_set(open_arrays(path, feeds, 0, 1)), None
    names, seq_len = token_feeds(path, feeds)
    vocab = vocab_size or 1 << 62
    stream = text.read_stream(path, vocab)
    if isinstance(tokenizer, Tokenizer):
        tok = tokenizer
        text.check_fits(tok, vocab)
    else:
        tok = text.make_tokenizer(tokenizer, [stream], vocab)
    return token_eval_set(text.tokens_of(stream, tok), seq_len, names), tok


class _Rows:
    """Rows ``index`` of an array (memory-mapped or not), read only when indexed, so a
    split of a file larger than memory stays mapped."""

    def __init__(self, array: np.ndarray, index: np.ndarray) -> None:
        self.array, self.index, self.dtype = array, index, array.dtype

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, rows: Any) -> np.ndarray:
        return self.array[self.index[rows]]


def _split_rows(data: NpzData, fraction: float) -> tuple[NpzData, NpzData]:
    """(training rows, validation rows) of ``data``: ``fraction`` of the rows, chosen by
    the seed (both in file order)."""
    count = data.rows_total
    held = round(count * fraction)
    if held < 1 or held >= count:
        raise ConfigError(f"data {data.path!r}: validation_fraction {fraction} of {count} "
                          f"rows leaves {held} for validation and {count - held} for "
                          f"training; each needs at least 1")
    order = np.random.default_rng([data.seed & 0xFFFFFFFF, _SPLIT_SALT]).permutation(count)
    val, train = np.sort(order[:held]), np.sort(order[held:])

    def part(rows: np.ndarray) -> NpzData:
        return NpzData(data.path, {n: _Rows(a, rows) for n, a in data.arrays.items()},
                       data.seed, data.batch_size, data.dtypes)
    return part(train), part(val)
