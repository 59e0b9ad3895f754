"""An .npz larger than memory: members stored uncompressed are memory-mapped (a process
reading batches from a real 256 MiB file keeps its own resident memory, RssAnon, small), a
compressed member too big for the rank is refused by name."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError
from ringflow.models import mlp
from ringflow.train.data import open_npz

ROWS, WIDTH = 1 << 18, 256       # x: 256 MiB of float32

READER = """
import sys
import ringflow as rf
from ringflow.models import mlp
from ringflow.train.data import open_npz
main, startup = rf.Program(), rf.Program()
with rf.program_guard(main, startup):
    model = mlp(input_size={width}, hidden_size=4, num_classes=2)
feeds = {{n: main.global_block().var(n) for n in model.feeds}}
data = open_npz(sys.argv[1], feeds, seed=0, global_batch_size=64)
for step in range(50):
    batch = data.batch(step, slice(0, 64))
index = data.indices(49, slice(0, 64))
assert (batch["y"] == index).all() and batch["y"].dtype.name == "int64"
assert (batch["x"] == index[:, None] % 7).all() and batch["x"].dtype.name == "float32"
status = open("/proc/self/status").read()
print(*(int(status.split(f"{{k}}:")[1].split()[0]) // 1024 for k in ("RssAnon", "RssFile")))
"""


def feeds_of(width: int):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = mlp(input_size=width, hidden_size=4, num_classes=2)
    return {name: main.global_block().var(name) for name in model.feeds}


@pytest.fixture(scope="module")
def big_npz(tmp_path_factory):
    """x float32 [2^18, 256] (row i holds i % 7; written from a broadcast view, so this
    process never holds it) and y int32 = the row number, stored uncompressed."""
    path = tmp_path_factory.mktemp("npz") / "big.npz"
    column = (np.arange(ROWS) % 7).astype(np.float32)[:, None]
    np.savez(path, x=np.broadcast_to(column, (ROWS, WIDTH)),
             y=np.arange(ROWS, dtype=np.int32))
    return path


def test_a_process_reading_batches_of_a_stored_npz_keeps_its_resident_memory_small(big_npz):
    assert big_npz.stat().st_size > 256 * 2**20
    out = subprocess.run([sys.executable, "-c", READER.format(width=WIDTH), str(big_npz)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    anon_mib, file_mib = map(int, out.stdout.split())
    # the process's own memory: the interpreter and 50 batches; the file's pages it mapped
    # (RssFile) are the kernel's page cache, clean and dropped under memory pressure
    assert anon_mib < 64, (anon_mib, file_mib)


def test_stored_members_are_memory_maps_in_c_and_fortran_order(tmp_path):
    x = np.arange(40, dtype=np.float64).reshape(10, 4)
    path = tmp_path / "f.npz"
    np.savez(path, x=np.asfortranarray(x), y=np.arange(10, dtype=np.int64))
    data = open_npz(str(path), feeds_of(4), seed=1, global_batch_size=4)
    assert all(isinstance(a, np.memmap) for a in data.arrays.values())
    batch = data.batch(2, slice(0, 4))
    index = data.indices(2, slice(0, 4))
    assert np.array_equal(batch["x"], x[index].astype(np.float32))
    assert batch["x"].flags.c_contiguous and np.array_equal(batch["y"], index)


def test_a_compressed_member_is_read_whole_when_it_fits_and_refused_when_not(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=np.ones((100, 4), np.float32), y=np.zeros(100, np.int64))
    data = open_npz(str(path), feeds_of(4), seed=0, global_batch_size=4, memory_bytes=10**6)
    assert not isinstance(data.arrays["x"], np.memmap)
    assert np.array_equal(data.batch(0, slice(0, 4))["x"], np.ones((4, 4), np.float32))
    with pytest.raises(ConfigError) as err:
        open_npz(str(path), feeds_of(4), seed=0, global_batch_size=4, memory_bytes=1000)
    assert str(err.value) == (
        f"data {str(path)!r}: array 'x' is stored compressed and takes 0.0 MiB once read, "
        f"more than this rank may hold (0.0 MiB: MemAvailable over the ranks of this host); "
        f"store it uncompressed (np.savez, not np.savez_compressed) and it is memory-mapped")


def test_a_stored_member_shorter_than_its_header_says_is_refused(tmp_path):
    """The header of x claims 11 rows where the member holds 10: mapping it would read the
    next member's bytes as rows."""
    path = tmp_path / "short.npz"
    np.savez(path, x=np.zeros((10, 4), np.float32), y=np.zeros(10, np.int64))
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"'shape': (10, 4)", b"'shape': (11, 4)", 1))
    with pytest.raises(ConfigError, match=r"member 'x.npy' is shorter than its array "
                                          r"float32\[11, 4\]"):
        open_npz(str(path), feeds_of(4), seed=0, global_batch_size=4)
