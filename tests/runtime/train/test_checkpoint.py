"""Checkpoint files: a step counts only when every host's manifest is there and every shard
it lists has its size, so a folder without its manifest or with a half-written shard is
passed over for the previous complete checkpoint; the last two complete ones are kept; a
shard restores the program's state all or nothing."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError
from ringflow.train.checkpoint import (
    Checkpointer,
    Layout,
    complete_checkpoints,
    discard_after,
    latest_checkpoint,
    list_steps,
    prune,
    read_best,
    read_complete,
    read_meta,
    remove_host_files,
    step_path,
    write_best,
    write_manifest,
    write_shard,
)


def _write(root, step, world=2, local_size=2, mp=1, manifests=True):
    """A step written by every rank of a job of ``world`` ranks, ``local_size`` per host."""
    for rank in range(world):
        write_shard(root, step, rank, {"w": np.full(3, float(step + rank))},
                    {"step": step, "rank": rank, "loss": 0.5})
    if manifests:
        for host in range(world // local_size):
            write_manifest(root, step, Layout(host * local_size, world, mp, local_size))


def test_a_complete_step_has_every_hosts_manifest_listing_its_shards(tmp_path):
    root = str(tmp_path)
    _write(root, 8, world=4, local_size=2, mp=2)
    found = read_complete(root, 8)
    assert (found.step, found.world_size, found.mp_degree, found.nnodes) == (8, 4, 2, 2)
    assert found.path == step_path(root, 8) == os.path.join(root, "step-00000008")
    manifest = json.loads((tmp_path / "step-00000008" / "manifest-host-1.json").read_text())
    assert manifest["step"] == 8 and manifest["nnodes"] == 2
    assert sorted(manifest["files"]) == ["rank-2.npz", "rank-3.npz"]
    assert read_meta(found.shard(3)) == {"step": 8, "rank": 3, "loss": 0.5}
    with np.load(found.shard(3)) as npz:
        np.testing.assert_array_equal(npz["w"], [11.0, 11.0, 11.0])


def test_a_step_without_its_manifest_is_passed_over(tmp_path):
    root = str(tmp_path)
    _write(root, 4)
    _write(root, 8, manifests=False)
    assert read_complete(root, 8) is None
    assert latest_checkpoint(root).step == 4


def test_a_step_missing_one_hosts_manifest_is_passed_over(tmp_path):
    root = str(tmp_path)
    _write(root, 4, world=4, local_size=2)
    _write(root, 8, world=4, local_size=2)
    os.unlink(tmp_path / "step-00000008" / "manifest-host-1.json")
    assert latest_checkpoint(root).step == 4


def test_a_half_written_shard_is_passed_over(tmp_path):
    root = str(tmp_path)
    _write(root, 4)
    _write(root, 8)
    shard = tmp_path / "step-00000008" / "rank-1.npz"
    shard.write_bytes(shard.read_bytes()[:100])       # as if cut off mid-write
    assert read_complete(root, 8) is None
    assert latest_checkpoint(root).step == 4


def test_a_torn_or_foreign_manifest_is_passed_over(tmp_path):
    root = str(tmp_path)
    _write(root, 4)
    _write(root, 8)
    (tmp_path / "step-00000008" / "manifest-host-0.json").write_text('{"step": 8, "wor')
    assert latest_checkpoint(root).step == 4
    _write(root, 12)
    manifest = tmp_path / "step-00000012" / "manifest-host-0.json"
    manifest.write_text(manifest.read_text().replace('"step": 12', '"step": 11'))
    assert latest_checkpoint(root).step == 4


def test_no_folder_or_no_complete_step_means_no_checkpoint(tmp_path):
    assert latest_checkpoint(str(tmp_path / "absent")) is None
    _write(str(tmp_path), 3, manifests=False)
    (tmp_path / "step-junk").mkdir()
    assert list_steps(str(tmp_path)) == [3]
    assert latest_checkpoint(str(tmp_path)) is None


def test_prune_keeps_the_last_two_complete_checkpoints(tmp_path):
    root = str(tmp_path)
    for step in (2, 4, 6, 8):
        _write(root, step)
    _write(root, 3, manifests=False)                   # an old incomplete leftover
    assert prune(root, Layout(0, 2, 1, 2)) == [2, 3, 4]
    assert list_steps(root) == [6, 8]


def test_the_best_checkpoint_is_marked_and_kept_from_pruning(tmp_path):
    root = str(tmp_path)
    for step in (2, 4, 6, 8):
        _write(root, step)
    best = {"step": 2, "val_loss": 1.25, "path": step_path(root, 2)}
    write_best(root, best)
    assert read_best(root) == best
    assert prune(root, Layout(0, 2, 1, 2), protect={2}) == [4]
    assert list_steps(root) == [2, 6, 8] and read_best(root) == best
    remove_host_files(root, 2, Layout(0, 2, 1, 2))
    assert read_best(root) is None                     # its folder is gone
    assert read_best(None) is None


def test_each_host_removes_only_its_files_and_the_last_one_the_folder(tmp_path):
    root = str(tmp_path)
    _write(root, 5, world=4, local_size=2)
    (tmp_path / "step-00000005" / ".rank-0.npz.abc123.tmp").write_bytes(b"partial")
    remove_host_files(root, 5, Layout(0, 4, 1, 2))
    assert sorted(os.listdir(tmp_path / "step-00000005")) == [
        "manifest-host-1.json", "rank-2.npz", "rank-3.npz"]
    remove_host_files(root, 5, Layout(2, 4, 1, 2))
    assert list_steps(root) == []


def test_discard_after_removes_later_steps_only(tmp_path):
    root = str(tmp_path)
    for step in (3, 6, 9):
        _write(root, step)
    assert discard_after(root, 3, Layout(0, 2, 1, 2)) == [6, 9]
    assert list_steps(root) == [3]


@pytest.fixture
def adam_program():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        model = rf.models.mlp(input_size=4, hidden_size=8, num_classes=3, dtype="float64")
        rf.optimizer.Adam(0.01).minimize(model.loss)
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed=model.make_batch(0, 0, 4), scope=scope)
    return main, scope


def test_a_shard_holds_every_persistable_and_restores_them(tmp_path, adam_program):
    main, scope = adam_program
    layout = Layout(0, 1, 1, 1)
    ckpt = Checkpointer(str(tmp_path), layout, main, scope, barrier=lambda: None)
    path = ckpt.save(1, {"run_count": 1, "loss": 1.25})
    names = {v.name for v in main.list_vars() if v.persistable and not v.is_data}
    assert any("moment1" in n for n in names) and any("beta1_pow" in n for n in names)
    with np.load(os.path.join(path, "rank-0.npz")) as npz:
        assert set(npz.files) == names | {"@train@meta"}
    fresh = rf.Scope()
    meta = Checkpointer(str(tmp_path), layout, main, fresh, lambda: None).restore(
        latest_checkpoint(str(tmp_path)))
    assert meta == {"run_count": 1, "loss": 1.25, "step": 1, "rank": 0}
    for name in names:
        np.testing.assert_array_equal(fresh[name], scope[name])


def test_a_shard_of_another_model_is_a_config_error_naming_it(tmp_path, adam_program):
    main, _ = adam_program
    root = str(tmp_path)
    write_shard(root, 1, 0, {"w": np.zeros(2)}, {"step": 1, "rank": 0})
    write_manifest(root, 1, Layout(0, 1, 1, 1))
    with pytest.raises(ConfigError, match=r"checkpoint .*rank-0\.npz does not fit this job: "
                                          r".*has no variable"):
        Checkpointer(root, Layout(0, 1, 1, 1), main, rf.Scope(), lambda: None).restore(
            latest_checkpoint(root))


def test_old_checkpoints_that_cannot_be_removed_are_a_warning_not_a_failure(
        tmp_path, adam_program, capsys):
    """Step 1's folder is immutable (chattr +i: root ignores modes), so pruning it after
    step 3 fails; step 3's checkpoint is complete and the save returns it."""
    main, scope = adam_program
    ckpt = Checkpointer(str(tmp_path), Layout(0, 1, 1, 1), main, scope, barrier=lambda: None)
    for step in (1, 2):
        ckpt.save(step, {"run_count": step, "loss": 1.0})
    subprocess.run(["chattr", "+i", step_path(str(tmp_path), 1)], check=True)
    try:
        capsys.readouterr()
        assert ckpt.save(3, {"run_count": 3, "loss": 1.0}) == step_path(str(tmp_path), 3)
    finally:
        subprocess.run(["chattr", "-i", step_path(str(tmp_path), 1)], check=True)
    assert capsys.readouterr().err == (
        f"[train] warning: older checkpoints could not be removed from "
        f"{step_path(str(tmp_path), 1)}/manifest-host-0.json: Operation not permitted\n")
    assert [c.step for c in complete_checkpoints(str(tmp_path))] == [1, 2, 3]
