"""save / load: persistable variables round-trip through one atomically written .npz."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ExecutionError


@pytest.fixture
def trained(net):
    """An MLP with Adam after two steps: (main program, scope, feed, loss)."""
    x = rf.data("x", [-1, 4], "float64")
    y = rf.data("y", [-1, 1], "int64")
    loss = net.mean(net.xent(net.fc(net.fc(x, 8, act="tanh"), 3), y))
    rf.optimizer.Adam(0.01).minimize(loss)
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(6, 4)), "y": rng.integers(0, 3, (6, 1))}
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(rf.default_startup_program(), scope=scope)
    for _ in range(2):
        exe.run(net.main, feed=feed, scope=scope)
    return net.main, scope, feed, loss


def _persistable_names(program):
    return sorted({v.name for v in program.list_vars() if v.persistable and not v.is_data})


def test_save_writes_every_persistable_variable_and_no_data(trained, tmp_path):
    main, scope, _, _ = trained
    path = rf.save(main, tmp_path / "ckpt", scope=scope)
    assert path == str(tmp_path / "ckpt.npz")
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == _persistable_names(main)
        assert "fc_0.w_0" in data.files and "x" not in data.files
        assert any("moment" in n for n in data.files)          # optimizer state too
        for name in data.files:
            np.testing.assert_array_equal(data[name], scope[name])


def test_load_restores_state_so_training_continues_identically(trained, tmp_path):
    main, scope, feed, loss = trained
    rf.save(main, tmp_path / "ckpt", scope=scope)
    restored = rf.Scope()
    rf.load(main, tmp_path / "ckpt.npz", scope=restored)    # either spelling of the path
    for name in _persistable_names(main):
        assert restored[name].dtype == scope[name].dtype
        np.testing.assert_array_equal(restored[name], scope[name])
    exe = rf.Executor()
    a = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]
    b = exe.run(main, feed=feed, fetch_list=[loss], scope=restored)[0]
    np.testing.assert_array_equal(a, b)


def test_load_defaults_to_the_global_scope(trained, tmp_path):
    main, scope, _, _ = trained
    rf.save(main, str(tmp_path / "ckpt"), scope=scope)
    rf.load(main, str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(rf.global_scope()["fc_1.w_0"], scope["fc_1.w_0"])


def test_save_replaces_the_file_and_leaves_no_temporary_files(trained, tmp_path):
    main, scope, _, _ = trained
    rf.save(main, tmp_path / "ckpt", scope=scope)
    scope["fc_0.b_0"] = scope["fc_0.b_0"] + 1.0
    rf.save(main, tmp_path / "ckpt", scope=scope)
    assert os.listdir(tmp_path) == ["ckpt.npz"]
    with np.load(tmp_path / "ckpt.npz") as data:
        np.testing.assert_array_equal(data["fc_0.b_0"], scope["fc_0.b_0"])


def test_failed_save_keeps_the_old_file(trained, tmp_path):
    main, scope, _, _ = trained
    rf.save(main, tmp_path / "ckpt", scope=scope)
    before = (tmp_path / "ckpt.npz").read_bytes()
    del scope["fc_1.b_0"]
    with pytest.raises(ExecutionError, match=r"persistable variable 'fc_1\.b_0' has no value in "
                                             r"the scope: run the startup program first"):
        rf.save(main, tmp_path / "ckpt", scope=scope)
    assert (tmp_path / "ckpt.npz").read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.npz"]


def _write(path, **arrays):
    np.savez(path, **arrays)


def test_load_of_a_file_missing_a_variable_names_it_and_changes_nothing(trained, tmp_path):
    main, scope, _, _ = trained
    with np.load(rf.save(main, tmp_path / "full", scope=scope)) as data:
        partial = {n: data[n] for n in data.files if n != "fc_1.w_0"}
    _write(tmp_path / "partial.npz", **partial)
    fresh = rf.Scope()
    with pytest.raises(ExecutionError, match=r"partial.npz': the file has no variable "
                                             r"'fc_1.w_0'"):
        rf.load(main, tmp_path / "partial", scope=fresh)
    assert len(fresh) == 0


@pytest.mark.parametrize("bad, message", [
    (np.zeros((4, 7)), r"variable 'fc_0.w_0' is stored as float64\[4, 7\], the program "
                       r"declares float64\[4, 8\]"),
    (np.zeros((4, 8), np.float32), r"variable 'fc_0.w_0' is stored as float32\[4, 8\]"),
])
def test_load_of_a_wrong_shape_or_dtype_names_the_variable(trained, tmp_path, bad, message):
    main, scope, _, _ = trained
    with np.load(rf.save(main, tmp_path / "full", scope=scope)) as data:
        arrays = {n: data[n] for n in data.files}
    arrays["fc_0.w_0"] = bad
    _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ExecutionError, match=message):
        rf.load(main, tmp_path / "bad", scope=rf.Scope())


def test_load_of_a_missing_file_names_the_path(trained, tmp_path):
    main, _, _, _ = trained
    with pytest.raises(ExecutionError, match=r"no checkpoint file '.*nowhere.npz'"):
        rf.load(main, tmp_path / "nowhere")


def test_saved_file_has_the_mode_of_a_plainly_created_file(trained, tmp_path):
    main, scope, _, _ = trained
    umask = os.umask(0o022)
    os.umask(umask)
    path = rf.save(main, tmp_path / "ckpt", scope=scope)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_write_npz_atomic_writes_any_named_arrays_under_the_exact_name(tmp_path):
    from ringflow.io import write_npz_atomic

    target = tmp_path / "sub" / "shard.bin"
    assert write_npz_atomic(target, {"file": np.arange(3), "@meta@": np.zeros(2, np.uint8)}) \
        == str(target)
    assert os.listdir(tmp_path / "sub") == ["shard.bin"]
    with np.load(target, allow_pickle=False) as data:
        assert sorted(data.files) == ["@meta@", "file"]
        np.testing.assert_array_equal(data["file"], [0, 1, 2])
