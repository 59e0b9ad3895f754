"""Checkpoints of a training job, written so that a crash at any moment leaves the previous
complete checkpoint usable:

    <checkpoint_dir>/step-<8 digits>/rank-<r>.npz             rank r's shard
    <checkpoint_dir>/step-<8 digits>/manifest-host-<h>.json   host h's part is complete

A shard holds every persistable variable of the rank's main program (parameters, sharded
ones as this rank's slice; optimizer moments and beta powers; the learning rate) and, in
the member ``@train@meta``, JSON with the step, the executor's run count of the main
program (dropout masks depend on it), the lr scheduler's position and the step's loss. Each
file is written to a temporary name, fsynced and renamed. After every rank has written its
shard (a barrier), the local rank 0 of host h (h = rank // ranks per host) writes the
host's manifest (step, world_size, mp_degree, nnodes, files: shard name -> bytes) last.
A step is complete when the manifests of all ``nnodes`` hosts of the job that wrote it
exist and agree and every shard they list has the listed size. The last ``KEEP`` complete
checkpoints are kept, and the best by validation loss (``best.json`` beside the step
folders: its step, validation loss and folder); each host removes its own files (manifest
first) from older steps. A save that fails (no permission, a full disk) raises
CheckpointWriteError naming the path and the cause; the temporary file is removed and the
previous checkpoint is left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import io
from ..errors import ConfigError, RingflowError

KEEP = 2
META_KEY = "@train@meta"
BEST = "best.json"
_STEP_RE = re.compile(r"^step-(\d{8})\Z")
_MANIFEST_INTS = ("step", "world_size", "mp_degree", "nnodes")


class CheckpointWriteError(RingflowError):
    """A checkpoint could not be written: the path and the cause (``OSError``'s)."""

    def __init__(self, step: int, path: str, cause: str) -> None:
        super().__init__(f"checkpoint of step {step} could not be written to {path}: {cause}")
        self.step, self.path = step, path


@contextlib.contextmanager
def _writing(step: int, path: str) -> Iterator[None]:
    """An OSError while writing ``path`` (or a file it names) as a CheckpointWriteError."""
    try:
        yield
    except OSError as exc:
        where = os.fspath(exc.filename) if exc.filename else path
        raise CheckpointWriteError(step, where, exc.strerror or str(exc)) from exc


@dataclass(frozen=True)
class Layout:
    """This rank's place: hosts run ``local_size`` consecutive ranks each."""

    rank: int
    world_size: int
    mp_degree: int
    local_size: int

    @property
    def host(self) -> int:
        return self.rank // self.local_size

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_size

    @property
    def nnodes(self) -> int:
        return self.world_size // self.local_size

    @property
    def host_ranks(self) -> range:
        return range(self.host * self.local_size, (self.host + 1) * self.local_size)


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step, directory and the layout of the job that wrote it."""

    step: int
    path: str
    world_size: int
    mp_degree: int
    nnodes: int

    def shard(self, rank: int) -> str:
        return os.path.join(self.path, shard_name(rank))


def step_path(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def shard_name(rank: int) -> str:
    return f"rank-{rank}.npz"


def manifest_name(host: int) -> str:
    return f"manifest-host-{host}.json"


# writing ----------------------------------------------------------------------------------
def write_shard(root: str, step: int, rank: int, arrays: dict[str, np.ndarray],
                meta: dict[str, Any]) -> str:
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    target = os.path.join(step_path(root, step), shard_name(rank))
    with _writing(step, target):
        return io.write_npz_atomic(target, {**arrays, META_KEY: blob})


def write_manifest(root: str, step: int, layout: Layout) -> str:
    """Host ``layout.host``'s manifest of ``step``, after its shards are all written."""
    with _writing(step, os.path.join(step_path(root, step), manifest_name(layout.host))):
        return _write_manifest(root, step, layout)


def _write_manifest(root: str, step: int, layout: Layout) -> str:
    directory = step_path(root, step)
    files = {}
    for rank in layout.host_ranks:
        name = shard_name(rank)
        files[name] = os.path.getsize(os.path.join(directory, name))
    manifest = {"step": step, "world_size": layout.world_size,
                "mp_degree": layout.mp_degree, "nnodes": layout.nnodes, "files": files}
    _fsync_dir(directory)  # the shards' renames reach the disk before the manifest's
    target = os.path.join(directory, manifest_name(layout.host))
    text = json.dumps(manifest, indent=1) + "\n"
    io.write_atomic(target, lambda f: f.write(text.encode()))
    _fsync_dir(directory)
    return target


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# reading ----------------------------------------------------------------------------------
def read_meta(shard: str) -> dict[str, Any]:
    with np.load(shard, allow_pickle=False) as npz:
        return json.loads(npz[META_KEY].tobytes().decode())


def _read_manifest(path: str) -> dict[str, Any] | None:
    """A manifest's content, or None for a missing, torn or malformed one."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("files"), dict) or not all(
            type(value.get(k)) is int for k in _MANIFEST_INTS):
        return None
    return value


def read_complete(root: str, step: int) -> Checkpoint | None:
    """The checkpoint of ``step`` if it is complete (see the module docstring), else None."""
    path = step_path(root, step)
    first = _read_manifest(os.path.join(path, manifest_name(0)))
    if first is None or first["nnodes"] < 1:
        return None
    shards: set[str] = set()
    for host in range(first["nnodes"]):
        manifest = _read_manifest(os.path.join(path, manifest_name(host)))
        if manifest is None or any(manifest[k] != first[k] for k in _MANIFEST_INTS):
            return None
        for name, size in manifest["files"].items():
            shard = os.path.join(path, name)
            if not os.path.isfile(shard) or os.path.getsize(shard) != size:
                return None
            shards.add(name)
    if first["step"] != step or shards != {shard_name(r) for r in range(first["world_size"])}:
        return None
    return Checkpoint(step, path, first["world_size"], first["mp_degree"], first["nnodes"])


def read_host_complete(root: str, step: int, host: int) -> Checkpoint | None:
    """The checkpoint of ``step`` if host ``host``'s part of it is complete: its manifest
    and every shard it lists. On hosts that do not share a disk this is all a host can see;
    the job then agrees on a step every host has (``worker``)."""
    path = step_path(root, step)
    manifest = _read_manifest(os.path.join(path, manifest_name(host)))
    if manifest is None or manifest["step"] != step or manifest["nnodes"] < 1:
        return None
    for name, size in manifest["files"].items():
        shard = os.path.join(path, name)
        if not os.path.isfile(shard) or os.path.getsize(shard) != size:
            return None
    return Checkpoint(step, path, manifest["world_size"], manifest["mp_degree"],
                      manifest["nnodes"])


def host_complete_steps(root: str, host: int) -> list[Checkpoint]:
    """Every step whose part of host ``host`` is complete, ascending."""
    found = (read_host_complete(root, step, host) for step in list_steps(root))
    return [c for c in found if c is not None]


def list_steps(root: str) -> list[int]:
    """Every step that has a folder under ``root``, complete or not, ascending."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_STEP_RE.match, names) if m)


def complete_checkpoints(root: str) -> list[Checkpoint]:
    found = (read_complete(root, step) for step in list_steps(root))
    return [c for c in found if c is not None]


def latest_checkpoint(root: str) -> Checkpoint | None:
    """The newest complete checkpoint under ``root`` (None if there is none)."""
    for step in reversed(list_steps(root)):
        found = read_complete(root, step)
        if found is not None:
            return found
    return None


def write_best(root: str, best: dict[str, Any]) -> str:
    """Marks the best checkpoint: ``{"step", "val_loss", "path"}`` in ``root/best.json``."""
    text = json.dumps(best) + "\n"
    return io.write_atomic(os.path.join(root, BEST), lambda f: f.write(text.encode()))


def read_best(root: str | None) -> dict[str, Any] | None:
    """The best checkpoint ``write_best`` marked under ``root``, if its folder is still
    there; else None."""
    if not root:
        return None
    try:
        with open(os.path.join(os.path.abspath(root), BEST), encoding="utf-8") as f:
            best = json.load(f)
        step = int(best["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return best if os.path.isdir(step_path(os.path.abspath(root), step)) else None


# removing ---------------------------------------------------------------------------------
def remove_host_files(root: str, step: int, layout: Layout) -> None:
    """This host's part of ``step``: its manifest first (the part stops counting as
    complete), then its shards and any temporary files a killed writer left; the folder
    goes when it is empty (other hosts may still have files in it)."""
    path = step_path(root, step)
    mine = [manifest_name(layout.host)] + [shard_name(r) for r in layout.host_ranks]
    for name in mine:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, name))
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(path):
            if name.endswith(".tmp") and any(name.startswith(f".{m}.") for m in mine):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(path, name))
    with contextlib.suppress(OSError):
        os.rmdir(path)


def prune(root: str, layout: Layout, keep: int = KEEP,
          protect: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Removes this host's files of every step older than the ``keep`` newest checkpoints
    complete on this host (called right after every host completed the newest, so these
    are complete everywhere), but those of ``protect`` (the best); returns those steps."""
    complete = host_complete_steps(root, layout.host)
    if len(complete) < keep:
        return []
    oldest_kept = complete[-keep].step
    old = [s for s in list_steps(root) if s < oldest_kept and s not in protect]
    for step in old:
        remove_host_files(root, step, layout)
    return old


def discard_after(root: str, step: int, layout: Layout) -> list[int]:
    """Removes this host's files of every step after ``step`` (the point a job starts
    from): leftovers of an interrupted write, or of a history that restarted."""
    newer = [s for s in list_steps(root) if s > step]
    for s in newer:
        remove_host_files(root, s, layout)
    return newer


class Checkpointer:
    """Saves and restores one rank's part of a job. ``barrier()`` waits for every rank of
    the job (the worker passes the global ring's)."""

    def __init__(self, root: str, layout: Layout, program, scope,
                 barrier: Callable[[], None]) -> None:
        self.root = os.path.abspath(root)
        self.layout, self.program, self.scope = layout, program, scope
        self.barrier = barrier

    def persistables(self) -> dict[str, np.ndarray]:
        names = {v.name for v in self.program.list_vars() if v.persistable and not v.is_data}
        return {name: np.asarray(self.scope[name]) for name in sorted(names)}

    def save(self, step: int, meta: dict[str, Any],
             protect: frozenset[int] | set[int] = frozenset()) -> str:
        """Every rank writes its shard; then each host's local rank 0 its manifest; then,
        with the new checkpoint complete everywhere, older ones go (but steps ``protect``;
        if they cannot, a warning line). Returns its folder; CheckpointWriteError if a file
        cannot be written (the ranks that could wait at the barrier until the failing one's
        exit fails it for them)."""
        write_shard(self.root, step, self.layout.rank, self.persistables(),
                    {**meta, "step": step, "rank": self.layout.rank})
        self.barrier()
        if self.layout.local_rank == 0:
            write_manifest(self.root, step, self.layout)
        self.barrier()
        if self.layout.local_rank == 0:
            try:
                prune(self.root, self.layout, protect=protect)
            except OSError as exc:  # the new checkpoint is complete: training goes on
                print(f"[train] warning: older checkpoints could not be removed from "
                      f"{exc.filename or self.root}: {exc.strerror or exc}", file=sys.stderr,
                      flush=True)
        return step_path(self.root, step)

    def sources(self, checkpoint: Checkpoint) -> list[str]:
        """The shards this rank loads: its own when the job has the layout that wrote the
        checkpoint; after a change of the data-parallel degree (the same tensor-parallel
        degree), every shard of its model-parallel rank, each variable taken from the first
        that holds it: parameters are in all of them, a sharded job's optimizer state in
        the shard of the rank that owned it (re-sharding)."""
        if checkpoint.world_size == self.layout.world_size:
            return [checkpoint.shard(self.layout.rank)]
        mp = self.layout.mp_degree
        return [checkpoint.shard(r) for r in range(checkpoint.world_size)
                if r % mp == self.layout.rank % mp]

    def restore(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """Loads this rank's part into the scope (all or nothing); returns its meta."""
        sources = self.sources(checkpoint)
        shard = sources[0]
        try:
            io.load_merged(self.program, sources, self.scope)
            meta = read_meta(shard)
        except (RingflowError, OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"checkpoint {shard} does not fit this job: {exc}") from None
        rank = self.layout.rank if len(sources) == 1 and checkpoint.world_size == \
            self.layout.world_size else self.layout.rank % self.layout.mp_degree
        if meta.get("rank") != rank or meta.get("step") != checkpoint.step:
            raise ConfigError(f"checkpoint {shard} is rank {meta.get('rank')}'s of step "
                              f"{meta.get('step')}, expected rank {rank}'s of "
                              f"step {checkpoint.step}")
        return meta
