"""The worker in a world of one (``main`` called in this process): it trains exactly the
model on the documented batches, logs the steps it should, resumes a finished or extended
job from its checkpoint, stops on a NaN/inf loss naming the step and the last good
checkpoint, stops when a checkpoint cannot be written naming the path (exit code 4) with
the previous checkpoint intact, and answers a bad spec with one line and exit code 2."""

from __future__ import annotations

import contextlib
import errno
import json
import re
import subprocess
import threading
import time

import numpy as np
import pytest

import ringflow as rf
from ringflow.launch.exits import EXIT_CHECKPOINT
from ringflow.train.checkpoint import latest_checkpoint, list_steps, read_complete
from tests.runtime.train.conftest import MLP_ARGS, TRANSFORMER_ARGS

BASE = {"model": "mlp", "model_args": MLP_ARGS, "dtype": "float64", "global_batch_size": 8,
        "seed": 3, "optimizer": {"type": "adam", "learning_rate": 0.01}}


def test_the_job_trains_the_model_on_its_seeded_batches(train_here):
    out = train_here({**BASE, "steps": 6, "log_every": 1})
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 3
    with rf.program_guard(main, startup):
        model = rf.models.mlp(**MLP_ARGS, dtype="float64")
        rf.optimizer.Adam(0.01).minimize(model.loss)
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(startup, scope=scope)
    expected = [float(exe.run(main, feed=model.make_batch(3, s, 8), fetch_list=[model.loss],
                              scope=scope)[0][0]) for s in range(6)]
    assert out.code == 0, out.stderr
    assert [out.losses[s] for s in range(1, 7)] == expected      # bitwise
    assert out.summary["final_loss"] == expected[-1] and out.summary["steps"] == 6


def test_metric_lines_at_step_one_every_log_every_and_the_last(train_here):
    out = train_here({**BASE, "steps": 12, "log_every": 5})
    assert [m["step"] for m in out.metrics] == [1, 5, 10, 12]
    for m in out.metrics:
        assert list(m) == ["step", "loss", "lr", "samples_per_s", "elapsed_s"]
        assert m["lr"] == 0.01 and m["samples_per_s"] > 0 and m["elapsed_s"] >= 0
    assert out.summary == {"final_loss": out.losses[12], "steps": 12,
                           "samples_per_s": out.summary["samples_per_s"],
                           "checkpoint": None, "resumed_from": None}


def test_the_lr_reported_is_the_rate_of_that_step(train_here):
    out = train_here({"model": "transformer", "model_args": TRANSFORMER_ARGS, "steps": 6,
                      "log_every": 1, "global_batch_size": 4,
                      "optimizer": {"type": "adamw", "learning_rate": 0.02},
                      "lr_schedule": {"type": "linear_warmup", "warmup_steps": 4}})
    assert out.code == 0, out.stderr
    assert [m["lr"] for m in out.metrics] == pytest.approx([0, 0.005, 0.01, 0.015, 0.02, 0.02])
    assert out.losses[1] > out.losses[6]


def test_a_finished_job_ends_at_once_with_its_summary(train_here, tmp_path):
    spec = {**BASE, "steps": 6, "checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every": 4}
    first = train_here(spec)
    again = train_here(spec)
    fewer = train_here({**spec, "steps": 5})
    path = str(tmp_path / "ck" / "step-00000006")
    assert first.summary["checkpoint"] == path
    for out in (again, fewer):
        assert out.code == 0 and out.metrics == []
        assert out.summary == {"final_loss": first.summary["final_loss"], "steps": 6,
                               "samples_per_s": None, "checkpoint": path, "resumed_from": 6}
    assert "[train] checkpoint step 6 is at or past the target of 5 steps" in fewer.stdout


def test_a_larger_target_continues_bitwise_like_one_longer_job(train_here, tmp_path):
    spec = {**BASE, "steps": 10, "log_every": 1, "model_args": {**MLP_ARGS, "dropout": 0.2},
            "lr_schedule": {"type": "step", "step_size": 3, "gamma": 0.5}, "grad_clip": 0.5}
    whole = train_here(spec)
    ck = {**spec, "checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every": 4}
    part = train_here({**ck, "steps": 6})
    rest = train_here(ck)
    assert part.code == rest.code == 0, part.stderr + rest.stderr
    assert f"[train] resuming from step 6: {tmp_path / 'ck' / 'step-00000006'}" in rest.stdout
    assert rest.summary["resumed_from"] == 6 and rest.summary["steps"] == 10
    assert {**part.losses, **rest.losses} == whole.losses                   # bitwise
    assert [m["step"] for m in rest.metrics] == [7, 8, 9, 10]
    assert [m["lr"] for m in rest.metrics] == [m["lr"] for m in whole.metrics[6:]]
    assert list_steps(str(tmp_path / "ck")) == [8, 10]                      # the last two


def test_a_nan_loss_stops_the_job_naming_the_step_and_last_checkpoint(train_here, tmp_path):
    out = train_here({**BASE, "steps": 50, "log_every": 1, "checkpoint_every": 1,
                      "checkpoint_dir": str(tmp_path / "ck"),
                      "optimizer": {"type": "sgd", "learning_rate": 1e12}})
    assert out.code == 3 and out.summaries == []
    match = re.fullmatch(r"\[train\] error: stopping: the (.*) at step (\d+); last good "
                         r"checkpoint: (\S+)\n", out.stderr)
    assert match, out.stderr
    what, step, where = match.groups()
    assert int(step) == len(out.metrics) + 1 or "not finite after the update" in what
    assert where == latest_checkpoint(str(tmp_path / "ck")).path
    with np.load(f"{where}/rank-0.npz") as npz:
        assert all(np.isfinite(npz[k]).all() for k in npz.files)


def test_an_inf_in_the_data_stops_at_step_one_with_no_checkpoint(train_here, tmp_path):
    x = np.ones((8, MLP_ARGS["input_size"]))
    x[5, 2] = np.inf
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(8, np.int64))
    out = train_here({**BASE, "data": str(tmp_path / "d.npz"), "steps": 3,
                      "checkpoint_dir": str(tmp_path / "ck")})
    assert out.code == 3 and out.metrics == []
    assert out.stderr == ("[train] error: stopping: the loss is nan (the global batch's "
                          "mean) at step 1; last good checkpoint: none (no checkpoint was "
                          "written)\n")


@contextlib.contextmanager
def breakable(root, how: str):
    """The checkpoint folder ``root`` and how to break it while a job runs: ``immutable``
    (chattr +i: nothing can be added, root included, as root ignores modes) or ``full`` (a
    1 MiB tmpfs filled up: ENOSPC). Yields (break, mend)."""
    root.mkdir()
    filler = root / "filler"
    if how == "full":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                        str(root)], check=True)

    def fill():
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    actions = {"immutable": (lambda: subprocess.run(["chattr", "+i", str(root)], check=True),
                             lambda: subprocess.run(["chattr", "-i", str(root)], check=True)),
               "full": (fill, lambda: filler.unlink())}[how]
    try:
        yield actions
    finally:
        if how == "full":
            subprocess.run(["umount", "-l", str(root)], check=True)
        else:
            subprocess.run(["chattr", "-i", str(root)], check=False)


def after_first_checkpoint(root, gate, act):
    """In a thread: once step 4's checkpoint is complete, ``act()``, then open the gate."""
    def watch():
        deadline = time.monotonic() + 60
        while read_complete(str(root), 4) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        act()
        gate.touch()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("how", "cause", "file"), [
    ("immutable", "Operation not permitted", ""),
    ("full", "No space left on device", "/rank-0.npz"),
])
def test_a_checkpoint_that_cannot_be_written_stops_the_job_keeping_the_previous_one(
        train_here, tmp_path, how, cause, file):
    root, gate = tmp_path / "ck", tmp_path / "gate"
    spec = {**BASE, "steps": 8, "log_every": 1, "checkpoint_every": 4,
            "checkpoint_dir": str(root), "model": "tests.runtime.train.gated_model:build",
            "model_args": {**MLP_ARGS, "gate": str(gate), "gate_step": 4}}
    with breakable(root, how) as (break_it, mend):
        watcher = after_first_checkpoint(root, gate, break_it)
        out = train_here(spec)
        watcher.join(5)
        assert out.code == EXIT_CHECKPOINT and out.summaries == []
        assert out.stderr == (f"[train] error: stopping: the checkpoint of step 8 could not "
                              f"be written to {root}/step-00000008{file}: {cause}; last good "
                              f"checkpoint: {root}/step-00000004\n")
        assert latest_checkpoint(str(root)).step == 4
        if file:  # the folder was made; the shard's temporary file is gone
            assert list((root / "step-00000008").iterdir()) == []
        mend()
        again = train_here(spec)  # the previous checkpoint loads
        assert again.code == 0, again.stderr
        assert "resuming from step 4: " in again.stdout
        assert again.summary["steps"] == 8 and again.summary["resumed_from"] == 4
        assert again.losses[5] == out.losses[5]


def test_an_npz_job_trains_on_the_files_rows(train_here, tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((20, MLP_ARGS["input_size"])),
             y=rng.integers(0, 8, 20))
    out = train_here({**BASE, "data": str(tmp_path / "d.npz"), "steps": 30, "log_every": 10})
    assert out.code == 0, out.stderr
    assert out.losses[30] < 0.5 * out.losses[1]      # 20 points are learnt by heart


def test_resume_with_another_tensor_parallel_degree_is_refused_naming_both(train_here,
                                                                           tmp_path):
    step = tmp_path / "ck" / "step-00000004"
    step.mkdir(parents=True)
    for r in range(2):
        (step / f"rank-{r}.npz").write_bytes(b"x")
    (step / "manifest-host-0.json").write_text(json.dumps(
        {"step": 4, "world_size": 2, "mp_degree": 2, "nnodes": 1,
         "files": {"rank-0.npz": 1, "rank-1.npz": 1}}))
    out = train_here({**BASE, "checkpoint_dir": str(tmp_path / "ck")})
    assert out.code == 2 and out.stdout.count("\n") <= 1
    assert out.stderr == (
        f"python -m ringflow.train: error: checkpoint {step} was written by a job of world "
        f"size 2 with tensor_parallel_degree 2; this job has world size 1 with "
        f"tensor_parallel_degree 1: run it with the same tensor_parallel_degree, or set "
        f"resume to false or another checkpoint_dir\n")


def test_resume_false_starts_over_and_replaces_later_checkpoints(train_here, tmp_path):
    spec = {**BASE, "steps": 8, "checkpoint_every": 4, "checkpoint_dir": str(tmp_path / "ck")}
    first = train_here(spec)
    again = train_here({**spec, "steps": 4, "resume": False})
    assert again.summary["resumed_from"] is None and again.losses[1] == first.losses[1]
    assert "removed checkpoint folder step-00000008: it is after the start point (step 0)" \
        in again.stdout
    assert list_steps(str(tmp_path / "ck")) == [4]


def test_a_model_builder_named_by_module_and_function(train_here, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    builtin = train_here({**BASE, "steps": 3, "log_every": 1})
    custom = train_here({**BASE, "steps": 3, "log_every": 1,
                         "model": "tests.runtime.train.gated_model:build",
                         "model_args": {**MLP_ARGS, "gate": str(gate), "gate_step": 1}})
    assert custom.code == 0 and custom.losses == builtin.losses


def test_recompute_true_trains_bitwise_like_the_plain_job(train_here):
    plain = train_here({**BASE, "steps": 4, "log_every": 1})
    recomputed = train_here({**BASE, "steps": 4, "log_every": 1, "recompute": True,
                             "model_args": {**MLP_ARGS, "num_layers": 3}})
    deeper = train_here({**BASE, "steps": 4, "log_every": 1,
                         "model_args": {**MLP_ARGS, "num_layers": 3}})
    assert recomputed.code == 0, recomputed.stderr
    assert recomputed.losses == deeper.losses and deeper.losses != plain.losses
    assert "recompute" in _job_line(recomputed.stdout)


def test_amp_trains_within_float16_rounding_of_float32(train_here):
    spec = {**BASE, "dtype": "float32", "steps": 5, "log_every": 1}
    full, mixed = train_here(spec), train_here({**spec, "amp": True})
    assert mixed.code == 0, mixed.stderr
    assert ", amp" in _job_line(mixed.stdout)
    steps = sorted(full.losses)
    np.testing.assert_allclose([mixed.losses[s] for s in steps],
                               [full.losses[s] for s in steps], rtol=5e-3)
    assert [mixed.losses[s] for s in steps] != [full.losses[s] for s in steps]


@pytest.mark.parametrize("spec, message", [
    ({"recompute": ["no_such_var"]}, "recompute: checkpoint 'no_such_var' is not a variable"),
    ({"model": "mlp", "recompute": True, "model_args": {"num_layers": 1}},
     "recompute is true but model mlp names no checkpoints"),
    ({"steps": 0}, "steps must be an integer >= 1, got 0"),
    ({"model": "no_such_pkg.mod:build"}, "model no_such_pkg.mod:build: cannot import "
                                         "no_such_pkg.mod"),
    ({"model": "mlp", "model_args": {"hidden_size": 0}},
     "model_args.hidden_size must be an integer >= 1, got 0"),
    ({"model": "json:dumps"}, "model json:dumps: dumps() missing 1 required positional "
                              "argument: 'obj'"),
])
def test_a_bad_spec_is_one_error_line_and_exit_code_2(train_here, spec, message):
    out = train_here(spec)
    assert out.code == 2 and out.metrics == []
    assert out.stderr.startswith(f"python -m ringflow.train: error: {message}")
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_the_command_line_wants_exactly_one_spec(capsys):
    from ringflow.train.__main__ import main

    assert main([], prog="ringflow train") == 2
    assert capsys.readouterr().err == ("ringflow train: error: expected one argument, the job "
                                       "spec SPEC.json; got 0\n")
    assert main(["a.json", "b.json"]) == 2
    assert "got 2: a.json b.json" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m ringflow.train SPEC.json")


def _job_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("[train] job: "))


def test_every_rank_says_once_where_it_runs(train_here):
    out = train_here({"model": "mlp", "steps": 1, "checkpoint_dir": None})
    (line,) = [x for x in out.stdout.splitlines() if " starts on host " in x]
    assert line.startswith("[train] rank 0 of 1 starts on host 0 (")
    assert line.endswith("mp rank 0 of 1, dp rank 0 of 1")


def test_gradient_accumulation_trains_like_one_step_of_the_whole_batch(train_here):
    """gradient_accumulation_steps 2: each step runs two micro-batches of 4 rows and applies
    their mean gradient once (fleet's gradient_merge); the learning rate moves once per
    step. Losses equal the job without accumulation within float64 rounding."""
    spec = {**BASE, "steps": 6, "log_every": 1,
            "lr_schedule": {"type": "step", "step_size": 2, "gamma": 0.5}}
    whole = train_here(spec)
    merged = train_here({**spec, "gradient_accumulation_steps": 2})
    assert merged.code == 0, merged.stderr
    steps = range(1, 7)
    np.testing.assert_allclose([merged.losses[s] for s in steps],
                               [whole.losses[s] for s in steps], rtol=1e-10)
    assert [m["lr"] for m in merged.metrics] == [m["lr"] for m in whole.metrics] \
        == pytest.approx([0.01, 0.01, 0.005, 0.005, 0.0025, 0.0025])
    assert merged.losses[6] != whole.losses[1]
