"""comm.shared_array: arrays in shared memory that all_reduce (and reduce_scatter_v /
all_gather_v, uneven parts) reduce where they lie, for 2-4
ranks, every supported dtype family, counts 0, 1, odd and above the one-round size, mixed with
plain all-reduces; identical bytes on every rank; no segment left."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.distributed.cases import v_bounds
from tests.runtime.distributed.workers.shared_array import CASES

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shared_arrays_all_reduce_in_place_to_the_sum_on_every_rank(spawn, tmp_path, world):
    job = spawn("shared_array.py", world, env={"RINGFLOW_COMM_TIMEOUT": "60"})
    assert job.wait(timeout=100) == [0] * world, job.output()
    assert job.shm_segments() == []
    per_rank = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(world)]
    for step in range(3):
        for count, dtype in CASES:
            key = f"{count}-{dtype}-{step}"
            want = (np.arange(count) % 1000 + 1) * sum(r + 1 + step for r in range(world))
            got = per_rank[0][key]
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, want.astype(dtype), err_msg=key)
            assert all(res[key].tobytes() == got.tobytes() for res in per_rank), key
        np.testing.assert_array_equal(per_rank[0][f"plain-{step}"],
                                      np.full(5000, world * (world + 1) / 2))
    for count, dtype in CASES:
        want = ((np.arange(count) % 1000 + 1) * sum(r + 1 for r in range(world))).astype(dtype)
        for cut in ("even", "skewed", "back"):
            key = f"v-{count}-{dtype}-{cut}"
            bounds = v_bounds(count, cut, world)
            for rank, res in enumerate(per_rank):
                np.testing.assert_array_equal(res[f"{key}-rs"],
                                              want[bounds[rank]:bounds[rank + 1]], err_msg=key)
                assert res[f"{key}-ag"].tobytes() == want.tobytes(), key


def test_a_shared_array_on_a_ring_across_hosts_is_a_plain_array(spawn, tmp_path):
    job = spawn("shared_array.py", 2, hosts=["127.0.0.1", "127.0.0.2"])
    assert job.wait(timeout=100) == [0, 0], job.output()
    got = dict(np.load(tmp_path / "rank0.npz"))["1003-float64-2"]
    np.testing.assert_array_equal(got, (np.arange(1003) % 1000 + 1) * 7.0)  # (1+2) + (2+2)
