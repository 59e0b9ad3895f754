"""save / load: a program's persistable variables (parameters, optimizer state, learning
rate) to and from one ``.npz`` file.

The file is numpy's npz format (a zip of ``<name>.npy`` members, readable with
``np.load``), written without pickles to a temporary file in the target directory, flushed
to disk and renamed over the target, so a crash leaves either the old file or the new one.
A path without the ``.npz`` suffix gets it, in ``save`` and ``load`` alike.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from .errors import ExecutionError
from .executor import Scope, global_scope
from .framework.program import Program, Variable

__all__ = ["load", "save", "write_npz_atomic"]

SUFFIX = ".npz"


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status). mkstemp
    makes files 0600; a checkpoint gets the mode a plain open() would give it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)   # elsewhere: read by setting, put back at once
    os.umask(mask)
    return mask


def checkpoint_path(path: str | os.PathLike) -> str:
    """The file ``save``/``load`` use for ``path``: ``path`` itself if it ends in .npz,
    else ``path + ".npz"`` (as Paddle's ``static.save`` appends ``.pdparams``)."""
    path = os.fspath(path)
    return path if path.endswith(SUFFIX) else path + SUFFIX


def _persistables(program: Program) -> list[Variable]:
    seen: dict[str, Variable] = {}
    for v in program.list_vars():
        if v.persistable and not v.is_data:
            seen.setdefault(v.name, v)
    return list(seen.values())


def save(program: Program, path: str | os.PathLike, scope: Scope | None = None) -> str:
    """Writes every persistable variable of ``program`` found in ``scope`` (default: the
    global scope) to one file, atomically; returns the file's path. A persistable
    variable without a value is an error (run the startup program first)."""
    scope = scope if scope is not None else global_scope()
    target = checkpoint_path(path)
    arrays = {}
    for v in _persistables(program):
        if v.name not in scope:
            raise ExecutionError(f"save {target!r}: persistable variable {v.name!r} has no "
                                 f"value in the scope: run the startup program first")
        arr = np.asarray(scope[v.name])
        if arr.dtype.hasobject:
            raise ExecutionError(f"save {target!r}: variable {v.name!r} holds Python objects "
                                 f"(dtype object); only numeric arrays are saved")
        arrays[v.name] = arr
    return write_npz_atomic(target, arrays)


def write_npz_atomic(target: str | os.PathLike, arrays: dict[str, np.ndarray]) -> str:
    """Writes ``arrays`` (member name -> numeric array) as the npz file ``target`` (no
    suffix added), atomically (``write_atomic``). Returns ``target`` as a string."""
    return write_atomic(target, lambda f: _write_npz(f, arrays))


def write_atomic(target: str | os.PathLike, write: Callable[[BinaryIO], None]) -> str:
    """Runs ``write(file)`` into a temporary file of ``target``'s directory, flushes and
    fsyncs it, then renames it over ``target`` (mode 0666 less the umask), so a crash leaves
    the old file or the new one, never a part. Returns ``target`` as a string."""
    target = os.fspath(target)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def _write_npz(f: Any, arrays: dict[str, np.ndarray]) -> None:
    # np.savez takes names as keyword arguments (a variable called "file" would clash) and
    # may pickle; writing the members directly avoids both.
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(arr),
                                          allow_pickle=False)


def load(program: Program, path: str | os.PathLike, scope: Scope | None = None) -> None:
    """Sets every persistable variable of ``program`` in ``scope`` (default: the global
    scope) from the file ``save`` wrote. All or nothing: a variable missing from the file,
    or stored with another shape or dtype than the program declares, is an error naming
    it, and then no variable is changed. Extra variables in the file are ignored."""
    load_merged(program, [path], scope)


def load_merged(program: Program, paths: list, scope: Scope | None = None) -> None:
    """``load`` from several files, each variable from the first file that holds it (the
    shards of a sharded job, whose ranks each saved their part of the optimizer state)."""
    scope = scope if scope is not None else global_scope()
    targets = [checkpoint_path(p) for p in paths]
    for target in targets:
        if not os.path.exists(target):
            raise ExecutionError(f"load: no checkpoint file {target!r}")
    values: dict[str, np.ndarray] = {}
    wanted = _persistables(program)
    stored: set[str] = set()
    for target in targets:
        with np.load(target, allow_pickle=False) as data:
            stored.update(data.files)
            for v in wanted:
                if v.name not in values and v.name in data.files:
                    arr = data[v.name]
                    _check_like(target, v, arr)
                    values[v.name] = arr
    for v in wanted:
        if v.name not in values:
            shown = ", ".join(sorted(stored)[:8]) + (", ..." if len(stored) > 8 else "")
            where = targets[0] if len(targets) == 1 else f"{len(targets)} files {targets}"
            raise ExecutionError(f"load {where!r}: the file has no variable {v.name!r} "
                                 f"(it has {len(stored)}: {shown})")
    for name, arr in values.items():
        scope[name] = arr


def _check_like(target: str, var: Variable, arr: np.ndarray) -> None:
    shape_ok = var.shape is None or (len(var.shape) == arr.ndim and all(
        d in (-1, s) for d, s in zip(var.shape, arr.shape)))
    if not shape_ok or arr.dtype.name != var.dtype:
        raise ExecutionError(
            f"load {target!r}: variable {var.name!r} is stored as {arr.dtype.name}"
            f"{list(arr.shape)}, the program declares {var.dtype}{list(var.shape or [])}")
