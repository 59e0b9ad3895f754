"""shm.copy_out: the copy out of a shared-memory slot, which takes another route than memmove
when source and destination sit at nearly the same offset within a page. Same bytes either
way, for every dtype, size and offset. And shm.room_for, which decides about shared arrays."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from ringflow.distributed.collective.transport import shm


@pytest.fixture
def segment():
    name = f"ringflow-copytest{uuid.uuid4().hex[:8]}-p0"
    seg = shm.create_segment(name, 1 << 20)
    yield seg
    seg.close()
    shm.unlink(name)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "uint8"])
@pytest.mark.parametrize("nbytes", [0, 8, 4096, 16 << 10, (128 << 10) + 4, 256 << 10, 1 << 20])
def test_copy_out_copies_the_same_bytes_at_every_page_offset(segment, dtype, nbytes):
    dt = np.dtype(dtype)
    count = nbytes // dt.itemsize
    rng = np.random.default_rng(nbytes)
    raw = rng.integers(0, 256, size=count * dt.itemsize, dtype=np.uint8)
    src = segment.slot(0)[:count * dt.itemsize].view(dt)
    src[...] = raw.view(dt)
    backing = np.empty(count * dt.itemsize + 8192, dtype=np.uint8)
    base = backing.ctypes.data
    # destinations at the source's page offset (the aliased case) and away from it
    for gap in (0, 16, 64, 2048, 4096 - 16):
        start = (src.ctypes.data + gap - base) % 4096
        start += (-start) % dt.itemsize
        dst = backing[start:start + count * dt.itemsize].view(dt)
        dst[...] = 0
        shm.copy_out(dst, src)
        assert dst.tobytes() == src.tobytes(), (dtype, nbytes, gap)


def test_the_segment_is_page_aligned_as_the_aliasing_rule_assumes(segment):
    assert segment.slot(0).ctypes.data % os.sysconf("SC_PAGE_SIZE") == 0


def test_room_for_compares_with_the_free_space_of_dev_shm():
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize
    assert shm.room_for(free // 4) is True
    assert shm.room_for(free) is False  # twice it is wanted: as much again to spare


def test_a_full_dev_shm_is_a_comm_error_when_the_segment_is_made_not_a_sigbus_later():
    """In a mount namespace whose /dev/shm is a 1 MiB tmpfs (root: as `make test` runs)."""
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.fail("needs root for a mount namespace (make test and CI run as root)",
                    pytrace=False)
    code = ("from ringflow.distributed.collective.transport import shm\n"
            "from ringflow.errors import CommError\n"
            "try:\n"
            "    shm.create_segment('ringflow-fulltest-p0', 4 << 20)\n"
            "except CommError as exc:\n"
            "    print('CommError:', exc)\n"
            "import os; print('left:', os.listdir('/dev/shm'))\n")
    done = subprocess.run(
        ["unshare", "--mount", "--", "sh", "-c",
         'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable, code],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "CommError: cannot reserve 8392704 bytes in /dev/shm/ringflow-fulltest-p0: No space " \
           "left on device (/dev/shm is full or too small?)" in done.stdout, done.stdout
    assert "left: []" in done.stdout  # the half-made segment is gone
