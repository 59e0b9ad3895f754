"""What one rank of a job needs in memory, from the spec and the rank's built program (its
parameter shards, its gradients, the optimizer's state, the activations at the per-rank
batch), and whether a host's MemAvailable holds its ranks: checked before the ranks start.

The estimate counts what ringflow's executor keeps: it holds every variable's array between
runs, so the activations are all the non-persistable variables of the rank's program (the
forward pass's outputs and their gradients), their shapes inferred at the per-rank batch.
At its first run the fused optimizer step (``compiler.fuse_optimizer``) lays parameters,
gradients and optimizer state end to end in flat buffers, copying them while the separate
arrays still exist: the peak holds them twice (``flat_copies``). The data a rank reads into
its own memory counts too (``data_bytes``): text as its int64 tokens, a CSV as its feeds;
memory-mapped data (``.npy`` streams, stored ``.npz`` members) lives in the page cache.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..framework.program import Block
from ..framework.registry import EMPTY_VAR_NAME, ShapeContext, get_op_def, grad_var_name
from .spec import JobSpec

MIB = 1 << 20
#: one rank's interpreter with numpy and ringflow imported, before any array (measured
#: with CPython 3.11 and numpy 2 on x86-64: 38-44 MiB resident)
RUNTIME_BYTES = 40 * MIB
MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank holds, by part."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    data: int = 0
    runtime: int = RUNTIME_BYTES

    @property
    def flat_copies(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return 2 * self.flat_copies + self.activations + self.data + self.runtime

    def describe(self) -> str:
        parts = ", ".join(f"{name} {_mib(value)}" for name, value in (
            ("parameters", self.parameters), ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state), ("activations", self.activations),
            *((("data", self.data),) if self.data else ()),
            ("first-step flat copies", self.flat_copies), ("interpreter", self.runtime)))
        return f"{_mib(self.total)} MiB per rank ({parts} MiB)"


def _mib(value: int) -> str:
    return f"{value / MIB:.1f}"


def estimate(spec: JobSpec, world_size: int, rank: int = 0) -> MemoryEstimate:
    """The estimate for rank `rank` of a job of `world_size` ranks (its shards, its share of
    a sharded optimizer state); builds the model like the rank does (a ConfigError if the
    model cannot be built), without touching this process's fleet state."""
    main = rank_program(spec, world_size, rank)
    block = main.global_block()
    batch = spec.global_batch_size // spec.dp_degree(world_size)
    shapes = concrete_shapes(block, batch)
    params = {p.name for p in block.iter_parameters()}
    grads = {grad_var_name(p) for p in params}
    sizes = {name: _bytes(shapes.get(name, v.shape), v.dtype, batch)
             for name, v in block.vars.items()}
    persistable = {name for name, v in block.vars.items() if v.persistable}
    return MemoryEstimate(
        parameters=sum(sizes[n] for n in params),
        gradients=sum(sizes[n] for n in grads if n in sizes),
        optimizer_state=sum(sizes[n] for n in persistable - params),
        activations=sum(s for n, s in sizes.items() if n not in persistable | grads),
        data=data_bytes(spec))


def data_bytes(spec: JobSpec) -> int:
    """Bytes of ``data`` and ``eval_data`` a rank holds in its own memory, from the files as
    this process sees them: text as int64 tokens (8 bytes a character, at most one
    character a byte of UTF-8), a CSV as its features in the model's dtype and int64
    labels, the compressed members of an ``.npz`` (read whole). Synthetic batches (counted
    as activations), ``.npy`` token streams and stored ``.npz`` members (memory-mapped: the
    page cache holds them) and a path this process cannot read (the ranks read it on their
    hosts) count 0."""
    paths = [p for p in (spec.data, spec.eval_data) if p and p != "synthetic"]
    return sum(_file_bytes(p, np.dtype(spec.dtype).itemsize) for p in paths)


def _file_bytes(path: str, itemsize: int) -> int:
    try:
        if path.endswith(".npy"):
            return 0
        if path.endswith(".npz"):
            with zipfile.ZipFile(path) as archive:
                return sum(i.file_size for i in archive.infolist()
                           if i.compress_type != zipfile.ZIP_STORED)
        if path.endswith(".csv"):
            return _csv_bytes(path, itemsize)
        from .text import text_files

        return 8 * sum(os.path.getsize(f) for f in text_files(path))
    except (OSError, UnicodeDecodeError, ConfigError, zipfile.BadZipFile):
        return 0


def _csv_bytes(path: str, itemsize: int) -> int:
    """Rows (non-blank lines, a header line not counted) x (features x itemsize + 8)."""
    from .data import _numbers

    with open(path, encoding="utf-8") as f:
        first = f.readline()
        rows = int(_numbers(first)) + sum(1 for line in f if line.strip())
    columns = first.count(",") + 1
    return rows * ((columns - 1) * itemsize + 8)


def rank_program(spec: JobSpec, world_size: int, rank: int = 0):
    """The main program rank `rank` runs (model, optimizer, fleet's rewrite); the builder's
    prints are swallowed and the fleet state of this process is left as it was."""
    from ..distributed import fleet
    from ..distributed.role_maker import UserDefinedRoleMaker
    from . import build

    role = UserDefinedRoleMaker(is_collective=True, current_id=rank,
                                worker_endpoints=[f"127.0.0.1:{6170 + i}"
                                                  for i in range(world_size)])
    with _fleet_state_kept(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        fleet.init(role, is_collective=True, strategy=build.job_strategy(spec))
        try:
            main, _, _, _ = build.build_programs(spec)
        except ConfigError:
            raise
        except Exception as exc:  # the builder's own code
            raise ConfigError(f"model {spec.model}: building it raised "
                              f"{type(exc).__name__}: {exc}") from None
    return main


@contextlib.contextmanager
def _fleet_state_kept() -> Iterator[None]:
    from ..distributed import fleet

    saved = copy.copy(vars(fleet._fleet))
    try:
        yield
    finally:
        vars(fleet._fleet).clear()
        vars(fleet._fleet).update(saved)


class _ConcreteShapes(ShapeContext):
    """Shape inference reading the shapes found so far instead of the declared ones."""

    def __init__(self, op, block: Block, shapes: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__(op, block)
        self._shapes = shapes

    def input_shape(self, slot: str, i: int = 0) -> tuple[int, ...]:
        name = self.op.inputs[slot][i]
        return self._shapes.get(name) or super().input_shape(slot, i)


def concrete_shapes(block: Block, batch: int) -> dict[str, tuple[int, ...]]:
    """Each variable's shape when the data variables (whose first dimension is -1) hold
    `batch` rows: the ops' shape inference re-run in program order. A variable whose
    inference fails or stays unknown is left out (`_bytes` reads -1 as `batch`)."""
    shapes: dict[str, tuple[int, ...]] = {}
    written = {n for op in block.ops for n in op.output_arg_names}
    for name, v in block.vars.items():
        if name not in written and not v.persistable and v.shape and -1 in v.shape:
            shapes[name] = tuple(batch if d == -1 else d for d in v.shape)
    for op in block.ops:
        opdef = get_op_def(op.type)
        if opdef.infer_shape is None:
            continue
        ctx = _ConcreteShapes(op, block, shapes)
        try:
            opdef.infer_shape(ctx)
        except Exception:  # an estimate: the declared shape stands in
            continue
        for slot, metas in ctx.results.items():
            for name, meta in zip(op.outputs.get(slot, []), metas):
                if name != EMPTY_VAR_NAME and meta is not None and -1 not in meta[0]:
                    shapes[name] = meta[0]
    return shapes


def _bytes(shape: Sequence[int] | None, dtype: str | None, batch: int) -> int:
    if not shape:
        return np.dtype(dtype or "float32").itemsize
    count = math.prod(batch if d == -1 else max(int(d), 0) for d in shape)
    return count * np.dtype(dtype or "float32").itemsize


# what a host has ---------------------------------------------------------------------------
def parse_meminfo(text: str) -> int:
    """MemAvailable of a /proc/meminfo text, in bytes."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "MemAvailable":
            value, *unit = rest.split()
            return int(value) * (1024 if unit == ["kB"] else 1)
    raise ConfigError("no MemAvailable line in /proc/meminfo (Linux >= 3.14 has one)")


def mem_available() -> int:
    with open(MEMINFO, encoding="ascii") as f:
        return parse_meminfo(f.read())


def check_fits(need: MemoryEstimate, ranks_per_host: int, available: Mapping[str, int]
               ) -> None:
    """A ConfigError naming the estimate, its parts and every host whose MemAvailable is
    less than its ranks need."""
    total = need.total * ranks_per_host
    short = {host: avail for host, avail in available.items() if avail < total}
    if not short:
        return
    hosts = ", ".join(f"host {host} has MemAvailable {_mib(avail)} MiB"
                      for host, avail in short.items())
    raise ConfigError(
        f"the job does not fit in memory: {ranks_per_host} rank(s) per host need "
        f"{_mib(total)} MiB, {need.describe()}; {hosts} (/proc/meminfo). Use smaller "
        f"sizes, a smaller global_batch_size, more tensor_parallel_degree or fewer ranks per "
        f"host, or memory_check=False to start it anyway")

