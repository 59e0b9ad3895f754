"""Data sources: the global batch of a step depends only on (seed, step, batch size) and
the data, the data-parallel ranks' rows put together are that batch, an .npz file is read
in seeded per-epoch permutations, and a file that does not fit the feeds is refused by
name."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError
from ringflow.models import mlp
from ringflow.train.data import NpzData, SyntheticData, local_rows, open_npz


@pytest.fixture
def feeds():
    """The feed variables of a small MLP (x float32 [-1, 3], y int64 [-1])."""
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = mlp(input_size=3, hidden_size=4, num_classes=2)
    return {name: main.global_block().var(name) for name in model.feeds}, model


def _file(tmp_path, n=10, **arrays):
    data = {"x": np.arange(3 * n, dtype=np.float64).reshape(n, 3),
            "y": np.arange(n, dtype=np.int32)}
    data.update(arrays)
    path = tmp_path / "d.npz"
    np.savez(path, **{k: v for k, v in data.items() if v is not None})
    return str(path)


def test_local_rows_split_the_global_batch_in_order():
    assert [local_rows(12, r, 3) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert local_rows(5, 0, 1) == slice(0, 5)


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_dp_ranks_rows_make_the_global_batch(tmp_path, feeds, dp):
    variables, model = feeds
    sources = [open_npz(_file(tmp_path), variables, seed=3, global_batch_size=8),
               SyntheticData(model.make_batch, 3, 8)]
    for source in sources:
        for step in (0, 1, 5):
            whole = source.batch(step, slice(0, 8))
            parts = [source.batch(step, local_rows(8, r, dp)) for r in range(dp)]
            for name in ("x", "y"):
                np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]),
                                              whole[name])


def test_npz_epochs_are_permutations_seeded_by_seed_and_epoch(tmp_path, feeds):
    variables, _ = feeds
    data = open_npz(_file(tmp_path, n=10), variables, seed=5, global_batch_size=4)
    order = np.concatenate([data.indices(s, slice(0, 4)) for s in range(5)])  # 2 epochs
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:]) == list(range(10))
    assert list(order[:10]) != list(order[10:])
    again = open_npz(_file(tmp_path, n=10), variables, seed=5, global_batch_size=4)
    np.testing.assert_array_equal(again.indices(3, slice(1, 3)), order[13:15])
    other = open_npz(_file(tmp_path, n=10), variables, seed=6, global_batch_size=4)
    assert list(other.indices(0, slice(0, 4))) != list(order[:4])


def test_npz_batch_gives_the_rows_in_the_feeds_dtypes(tmp_path, feeds):
    variables, _ = feeds
    data = open_npz(_file(tmp_path, n=10), variables, seed=0, global_batch_size=4)
    batch = data.batch(2, slice(0, 4))
    index = data.indices(2, slice(0, 4))
    assert batch["x"].dtype == np.float32 and batch["y"].dtype == np.int64
    np.testing.assert_array_equal(batch["y"], index)     # y holds the row number
    np.testing.assert_array_equal(batch["x"][:, 0], 3 * index)


def test_a_file_smaller_than_a_batch_wraps_over_epochs(tmp_path, feeds):
    variables, _ = feeds
    data = open_npz(_file(tmp_path, n=3), variables, seed=0, global_batch_size=7)
    index = data.indices(0, slice(0, 7))
    assert sorted(index[:3]) == [0, 1, 2] and sorted(index[3:6]) == [0, 1, 2]
    assert isinstance(data, NpzData) and data.rows_total == 3


@pytest.mark.parametrize("arrays, message", [
    ({"y": None}, "has no array 'y' (it has x); the model feeds x, y"),
    ({"y": np.zeros(10, np.float32)}, "array 'y' is float32[10]; the feed is int64"),
    ({"x": np.zeros((10, 4))}, "array 'x' has shape [10, 4]; the feed takes [-1, 3]"),
    ({"x": np.zeros(10)}, "array 'x' has shape [10]; the feed takes [-1, 3]"),
    ({"y": np.zeros(9, np.int64)}, "the same number of rows, at least 1; got {'x': 10, 'y': 9}"),
])
def test_a_file_that_does_not_fit_the_feeds_is_named(tmp_path, feeds, arrays, message):
    variables, _ = feeds
    with pytest.raises(ConfigError) as err:
        open_npz(_file(tmp_path, **arrays), variables, 0, 4)
    assert message in str(err.value)


def test_a_missing_or_unreadable_file_is_named(tmp_path, feeds):
    variables, _ = feeds
    with pytest.raises(ConfigError, match=r"data '.*nope\.npz': no such file"):
        open_npz(str(tmp_path / "nope.npz"), variables, 0, 4)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"is not a readable \.npz"):
        open_npz(str(tmp_path / "junk.npz"), variables, 0, 4)
