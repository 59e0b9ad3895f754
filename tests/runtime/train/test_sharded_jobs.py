"""Sharded training jobs (``sharding_stage``) as real launcher jobs: each rank's checkpoint
shard holds the optimizer state of its own parameters only (with a manifest as every job);
a job resumed on the layout that wrote the checkpoint prints bitwise the losses of an
uninterrupted one, and one resumed with another data-parallel degree (1 or 4 ranks from a
2-rank checkpoint) re-shards the state and prints them within float64 rounding."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ringflow.train.checkpoint import list_steps
from tests.runtime.train.conftest import MLP_ARGS, run_job

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]

JOB = {"model": "mlp", "model_args": MLP_ARGS, "dtype": "float64", "steps": 6,
       "log_every": 1, "global_batch_size": 8, "seed": 3, "checkpoint_every": 3,
       "optimizer": {"type": "adamw", "learning_rate": 0.01}, "grad_clip": 0.5}
MOMENTS = ("_moment1_0", "_moment2_0", "_beta1_pow_acc_0", "_beta2_pow_acc_0")


def _from_step_3(launcher, name: str, ck: str) -> str:
    """A checkpoint folder holding only the reference job's step 3."""
    target = launcher.dir / name
    shutil.copytree(launcher.dir / ck / "step-00000003", target / "step-00000003")
    return str(target)


@pytest.mark.parametrize("stage", [1, 2])
def test_a_sharded_job_resumes_bitwise_and_re_shards_to_other_dp_degrees(launcher, stage):
    spec = {**JOB, "sharding_stage": stage, "checkpoint_dir": str(launcher.dir / "ck")}
    reference = run_job(launcher, spec, 2, "reference.json")
    assert reference.code == 0, reference.stdout + reference.stderr
    assert sorted(reference.losses) == [1, 2, 3, 4, 5, 6]
    assert list_steps(str(launcher.dir / "ck")) == [3, 6]

    shards = [dict(np.load(launcher.dir / "ck" / "step-00000003" / f"rank-{r}.npz"))
              for r in range(2)]
    state = [{n for n in s if n.endswith(MOMENTS)} for s in shards]
    assert state[0] and state[1] and not state[0] & state[1]        # disjoint, both hold some
    params = {n for n in shards[0] if n.startswith("mlp.") and not n.endswith(MOMENTS)}
    assert {n.rsplit("_", 3)[0] for n in state[0] | state[1]} >= {p for p in params}

    worlds = [2, 1, 4] if stage == 1 else [2]
    for world in worlds:
        ck = _from_step_3(launcher, f"ck-w{world}", "ck")
        resumed = run_job(launcher, {**spec, "checkpoint_dir": ck}, world, f"w{world}.json")
        assert resumed.code == 0, resumed.stdout + resumed.stderr
        assert f"[train] resuming from step 3: {ck}/step-00000003" in resumed.stdout
        assert sorted(resumed.losses) == [4, 5, 6]
        got = [resumed.losses[s] for s in (4, 5, 6)]
        want = [reference.losses[s] for s in (4, 5, 6)]
        if world == 2:
            assert got == want, world                                 # bitwise
        else:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=0, err_msg=str(world))


def test_a_sharded_job_with_tensor_parallelism_trains_the_unsharded_jobs_losses(launcher):
    """tensor_parallel_degree 2 x sharding over the 2 data-parallel ranks: the losses of the
    same job without sharding within float64 rounding (and the state re-shards)."""
    spec = {**JOB, "model": "transformer", "tensor_parallel_degree": 2, "steps": 4,
            "model_args": {"vocab_size": 32, "seq_len": 8, "hidden_size": 16,
                           "num_heads": 4, "num_layers": 1, "ffn_size": 32}}
    plain = run_job(launcher, spec, 4, "plain.json")
    sharded = run_job(launcher, {**spec, "sharding_stage": 2}, 4, "sharded.json")
    for out in (plain, sharded):
        assert out.code == 0, out.stdout + out.stderr
        assert sorted(out.losses) == [1, 2, 3, 4]
    assert "sharding stage 2" in sharded.stdout
    np.testing.assert_allclose([sharded.losses[s] for s in range(1, 5)],
                               [plain.losses[s] for s in range(1, 5)], rtol=1e-10, atol=0)
