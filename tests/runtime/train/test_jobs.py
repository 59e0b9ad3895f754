"""Training jobs as real processes: ``python -m ringflow.launch ... -m ringflow.train`` and
the ``ringflow train`` console script. Every layout sees the same samples (the per-step
global losses of (world, degree) = (1,1), (2,1), (2,2) agree within float64 rounding); a job
killed mid-run and started again resumes from its newest complete checkpoint, passing over
a half-written one, and prints bitwise the losses of an uninterrupted job; a NaN loss stops
every rank at the same step. The ``launcher`` fixture fails a test that leaves a process or
a shared-memory segment behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from ringflow.train.checkpoint import list_steps
from tests.runtime.train.conftest import (
    JOB_ENV,
    MLP_ARGS,
    TRANSFORMER_ARGS,
    Output,
    read_until,
    run_job,
    start_job,
    write_spec,
)

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

MLP_JOB = {"model": "mlp", "model_args": MLP_ARGS, "dtype": "float64", "steps": 5,
           "log_every": 1, "global_batch_size": 8, "seed": 11,
           "optimizer": {"type": "adam", "learning_rate": 0.01}, "grad_clip": 1.0}
RINGFLOW = os.path.join(os.path.dirname(sys.executable), "ringflow")


def console_train(directory, spec: dict, name: str = "spec.json") -> Output:
    """``ringflow train SPEC.json`` (the console script), one process, no PADDLE_* env."""
    path = write_spec(directory, spec, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    env.update(JOB_ENV)
    done = subprocess.run([RINGFLOW, "train", str(path)], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=60)
    return Output(done.returncode, done.stdout, done.stderr)


def test_every_layout_trains_on_the_same_samples(launcher):
    serial = console_train(launcher.dir, MLP_JOB)
    dp2 = run_job(launcher, {**MLP_JOB, "tensor_parallel_degree": 1}, 2, "dp2.json")
    mp2 = run_job(launcher, {**MLP_JOB, "tensor_parallel_degree": 2}, 2, "mp2.json")
    for out in (serial, dp2, mp2):
        assert out.code == 0, out.stdout + out.stderr
        assert sorted(out.losses) == [1, 2, 3, 4, 5]
    expected = [serial.losses[s] for s in range(1, 6)]
    for out in (dp2, mp2):
        np.testing.assert_allclose([out.losses[s] for s in range(1, 6)], expected,
                                   rtol=1e-10, atol=0)
        assert out.summary["final_loss"] == out.losses[5]
    assert expected[-1] < expected[0]


def test_the_console_script_trains_in_one_process(tmp_path):
    out = console_train(tmp_path, {**MLP_JOB, "steps": 3, "checkpoint_dir": "ck"})
    assert out.code == 0, out.stderr
    assert [m["step"] for m in out.metrics] == [1, 2, 3]
    assert out.summary["checkpoint"] == str(tmp_path / "ck" / "step-00000003")
    assert list_steps(str(tmp_path / "ck")) == [3]
    bad = console_train(tmp_path, {"steps": 0}, "bad.json")
    assert bad.code == 2
    assert bad.stderr == "ringflow train: error: steps must be an integer >= 1, got 0\n"


# (world, degree, base model, its arguments, dtype)
RESUME_CASES = [
    pytest.param(2, 2, "transformer", {**TRANSFORMER_ARGS, "dropout": 0.1}, "float32", id="mp2"),
    pytest.param(2, 1, "mlp", {**MLP_ARGS, "dropout": 0.2}, "float64", id="dp2"),
]


@pytest.mark.parametrize("world, degree, base, args, dtype", RESUME_CASES)
def test_an_interrupted_job_resumes_bitwise_like_an_uninterrupted_one(
        launcher, world, degree, base, args, dtype):
    gate = launcher.dir / "gate"
    spec = {"model": "tests.runtime.train.gated_model:build", "dtype": dtype,
            "model_args": {**args, "base": base, "gate": str(gate), "gate_step": 7},
            "steps": 10, "log_every": 1, "global_batch_size": 8, "seed": 5,
            "tensor_parallel_degree": degree, "grad_clip": 0.5,
            "optimizer": {"type": "adam", "learning_rate": 0.01},
            "lr_schedule": {"type": "cosine", "T_max": 12}}
    gate.touch()
    reference = run_job(launcher, spec, world, "reference.json")
    assert reference.code == 0, reference.stdout + reference.stderr
    gate.unlink()

    ck = {**spec, "checkpoint_dir": str(launcher.dir / "ck"), "checkpoint_every": 3}
    job = start_job(launcher, ck, world, "interrupted.json")
    seen = read_until(job, lambda line: '[train] metric {"step": 7,' in line, timeout=60)
    os.killpg(job.pid, signal.SIGKILL)     # the launcher; its ranks die with it
    job.communicate(timeout=10)
    interrupted = Output(job.returncode, seen)
    assert job.returncode == -signal.SIGKILL and interrupted.summaries == []
    assert list_steps(str(launcher.dir / "ck")) == [3, 6]
    _half_written_step(launcher.dir / "ck", step=7, world=world)

    gate.touch()
    resumed = run_job(launcher, ck, world, "resumed.json")
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    assert f"[train] resuming from step 6: {launcher.dir / 'ck' / 'step-00000006'}" \
        in resumed.stdout
    assert "removed checkpoint folder step-00000007" in resumed.stdout
    assert sorted(interrupted.losses) == list(range(1, 8))
    assert sorted(resumed.losses) == [7, 8, 9, 10]
    assert {**interrupted.losses, **resumed.losses} == reference.losses      # bitwise
    assert resumed.summary == {**reference.summary, "resumed_from": 6,
                               "samples_per_s": resumed.summary["samples_per_s"],
                               "checkpoint": str(launcher.dir / "ck" / "step-00000010")}
    assert list_steps(str(launcher.dir / "ck")) == [9, 10]


def _half_written_step(root, step: int, world: int) -> None:
    """What a job killed while writing ``step`` leaves: some shards, one cut short, a
    temporary file, no manifest."""
    previous = root / f"step-{step - 1:08d}"
    folder = root / f"step-{step:08d}"
    folder.mkdir()
    for rank in range(world):
        shutil.copy(previous / f"rank-{rank}.npz", folder / f"rank-{rank}.npz")
    cut = folder / "rank-0.npz"
    cut.write_bytes(cut.read_bytes()[:200])
    (folder / f".rank-{world - 1}.npz.k2j4.tmp").write_bytes(b"partial")


def test_a_nan_loss_stops_every_rank_at_the_same_step(launcher):
    spec = {**MLP_JOB, "steps": 50, "optimizer": {"type": "sgd", "learning_rate": 1e12},
            "grad_clip": None}
    out = run_job(launcher, spec, 2)
    assert out.code == 3, out.stdout
    errors = [line for line in out.stdout.splitlines() if "[train] error: stopping:" in line]
    steps = {line.split(" at step ")[1].split(";")[0] for line in errors}
    assert len(steps) == 1 and int(steps.pop()) == len(out.metrics) + 1
    assert all(line.endswith("last good checkpoint: none (no checkpoint was written)")
               for line in errors)
    assert out.summaries == []
