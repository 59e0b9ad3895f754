"""A transformer trained on text (the repository's own source, char tokenizer, a validation
tail) as real launcher jobs: the same job at (world, mp) = (1,1), (2,1), (2,2) and (4,2) on
two "hosts" (127.0.0.1 and 127.0.0.2, an agent each) prints equal per-step training and
validation losses, and so does (2,1) with gradient accumulation; a resumed job continues
bitwise; ``ringflow evaluate`` on the (2,2) checkpoint in one process gives the job's last
validation loss; ``ringflow generate`` is deterministic from a seed and the same from the
TP-2 checkpoint as from the serial job's. The jobs run once per module; each test reads
them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringflow.launch.ports import pick_base_port
from tests.runtime.launch.conftest import Launcher, marked_processes
from tests.runtime.train.conftest import JOB_ENV, REPO, Output, run_job, write_spec

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

RINGFLOW = os.path.join(os.path.dirname(sys.executable), "ringflow")
LAYOUTS = [(1, 1), (2, 1), (2, 2), (4, 2)]
SOURCES = ["provider/ringflow/models/transformer.py", "provider/ringflow/models/mlp.py"]


def _job(folder: Path, ck: Path, steps: int = 4) -> dict:
    return {"model": "transformer", "dtype": "float64", "seed": 5, "steps": steps,
            "model_args": {"vocab_size": 128, "seq_len": 16, "hidden_size": 16,
                           "num_heads": 4, "num_layers": 1, "ffn_size": 32},
            "data": str(folder), "tokenizer": "char", "validation_fraction": 0.1,
            "eval_every": 2, "log_every": 1, "global_batch_size": 8,
            "checkpoint_dir": str(ck), "checkpoint_every": 2,
            "optimizer": {"type": "adam", "learning_rate": 0.01}}


def _two_hosts(harness: Launcher, spec: dict, name: str) -> Output:
    """Two agents, one per "host", of one job: host 0's stdout has rank 0's lines."""
    path = write_spec(harness.dir, spec, name)
    base = str(pick_base_port(2))
    agents = [harness.start("--nproc-per-host", "2", "--hosts", "127.0.0.1,127.0.0.2",
                            "--host-index", str(i), "--base-port", base, "--log-dir",
                            f"log-{name}-{i}", "-m", "ringflow.train", str(path),
                            env=harness.env(**JOB_ENV)) for i in (0, 1)]
    done = [harness.finish(a, timeout=120) for a in agents]
    return Output(max(abs(d.returncode) for d in done), done[0].stdout,
                  done[0].stderr + done[1].stdout + done[1].stderr)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """{(world, mp): Output} of the four layouts, their checkpoint folders, and a job
    resumed at step 2 on (2,2)."""
    harness = Launcher(tmp_path_factory.mktemp("text"))
    corpus = harness.dir / "corpus"
    corpus.mkdir()
    for source in SOURCES:
        (corpus / Path(source).name).write_text((REPO / source).read_text())
    outs, cks = {}, {}
    try:
        for world, mp in LAYOUTS:
            cks[world, mp] = harness.dir / f"ck-{world}x{mp}"
            spec = {**_job(corpus, cks[world, mp]), "tensor_parallel_degree": mp}
            name = f"w{world}mp{mp}.json"
            outs[world, mp] = (_two_hosts(harness, spec, name) if world == 4
                               else run_job(harness, spec, world, name, timeout=120))
        accumulated = run_job(harness, {**_job(corpus, harness.dir / "ck-accumulated"),
                                        "gradient_accumulation_steps": 2}, 2,
                              "accumulated.json", timeout=120)
        resumed_ck = harness.dir / "ck-resumed"
        spec = {**_job(corpus, resumed_ck), "tensor_parallel_degree": 2}
        first = run_job(harness, {**spec, "steps": 2}, 2, "first.json", timeout=120)
        resumed = run_job(harness, spec, 2, "resumed.json", timeout=120)
        yield {"outs": outs, "cks": cks, "corpus": corpus, "first": first,
               "resumed": resumed, "accumulated": accumulated, "dir": harness.dir}
    finally:
        harness.cleanup()
    assert not marked_processes(harness.mark)


def _val(out: Output) -> dict[int, float]:
    return {m["step"]: m["val_loss"] for m in out.metrics if "val_loss" in m}


def test_every_layout_trains_and_validates_on_the_same_text(jobs):
    outs = jobs["outs"]
    for layout, out in outs.items():
        assert out.code == 0, (layout, out.stdout + out.stderr)
        assert sorted(out.losses) == [1, 2, 3, 4] and sorted(_val(out)) == [2, 4], layout
    serial = outs[1, 1]
    for layout in LAYOUTS[1:]:
        out = outs[layout]
        np.testing.assert_allclose([out.losses[s] for s in (1, 2, 3, 4)],
                                   [serial.losses[s] for s in (1, 2, 3, 4)],
                                   rtol=1e-10, atol=0, err_msg=str(layout))
        np.testing.assert_allclose([_val(out)[s] for s in (2, 4)],
                                   [_val(serial)[s] for s in (2, 4)],
                                   rtol=1e-10, atol=0, err_msg=str(layout))
    assert "on 2 host(s)" in outs[4, 2].stdout
    # the validation loss is real: below the uniform guess over the 128 tokens
    assert _val(serial)[4] < _val(serial)[2] < math.log(128)


def test_gradient_accumulation_trains_and_validates_as_the_whole_batch(jobs):
    """(2,1) in two micro-steps of 4 samples (2 a rank): the same per-step training and
    validation losses as the serial job (validation runs in micro-batches too)."""
    out, serial = jobs["accumulated"], jobs["outs"][1, 1]
    assert out.code == 0, out.stdout + out.stderr
    assert sorted(out.losses) == [1, 2, 3, 4] and sorted(_val(out)) == [2, 4]
    np.testing.assert_allclose([out.losses[s] for s in (1, 2, 3, 4)],
                               [serial.losses[s] for s in (1, 2, 3, 4)], rtol=1e-10, atol=0)
    np.testing.assert_allclose([_val(out)[s] for s in (2, 4)],
                               [_val(serial)[s] for s in (2, 4)], rtol=1e-10, atol=0)


def test_the_summary_keeps_the_validation_and_marks_the_best_checkpoint(jobs):
    out, ck = jobs["outs"][2, 2], jobs["cks"][2, 2]
    best = json.loads((ck / "best.json").read_text())
    assert best == {"step": 4, "val_loss": _val(out)[4], "path": str(ck / "step-00000004")}
    assert out.summary["val_loss"] == _val(out)[4]
    assert out.summary["best_val_loss"] == best["val_loss"]
    assert out.summary["best_checkpoint"] == best["path"]


def test_a_resumed_text_job_continues_bitwise(jobs):
    first, resumed, whole = jobs["first"], jobs["resumed"], jobs["outs"][2, 2]
    assert first.code == 0 and resumed.code == 0, resumed.stdout + resumed.stderr
    assert "[train] resuming from step 2" in resumed.stdout
    assert sorted(resumed.losses) == [3, 4]
    assert {**first.losses, **resumed.losses} == whole.losses           # bitwise
    assert {**_val(first), **_val(resumed)} == _val(whole)
    assert resumed.summary["best_checkpoint"].endswith("step-00000004")


def _console(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RINGFLOW_"))}
    return subprocess.run([RINGFLOW, *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_evaluate_on_a_2x2_checkpoint_is_the_jobs_last_validation_loss(jobs):
    done = _console("evaluate", str(jobs["cks"][2, 2]))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    last = _val(jobs["outs"][2, 2])[4]
    assert result["val_loss"] == pytest.approx(last, rel=1e-10, abs=0)
    assert result["perplexity"] == pytest.approx(math.exp(result["val_loss"]), rel=1e-12)
    assert result["step"] == 4 and result["checkpoint"] == str(
        jobs["cks"][2, 2] / "step-00000004")
    # other data: the same file read by the serial job's checkpoint and the TP-2 one
    data = str(jobs["corpus"] / "mlp.py")
    values = [json.loads(_console("evaluate", str(jobs["cks"][layout]), "--data",
                                  data).stdout)["val_loss"] for layout in ((1, 1), (4, 2))]
    assert values[0] == pytest.approx(values[1], rel=1e-10, abs=0)
    bad = _console("evaluate", str(jobs["dir"] / "nowhere"))
    assert bad.returncode == 2 and bad.stderr.startswith("ringflow evaluate: error: ")


def test_generation_is_seeded_and_the_same_from_the_tp2_checkpoint_and_serially(jobs):
    from ringflow.generate import generate

    args = dict(prompt="def ", max_new_tokens=40, temperature=0.8, top_k=10, seed=3)
    tp2 = generate(str(jobs["cks"][2, 2]), **args)
    serial = generate(str(jobs["cks"][1, 1]), **args)
    assert tp2["tokens"] == serial["tokens"] and len(tp2["tokens"]) == 40
    assert tp2["text"] == serial["text"]
    runs = [_console("generate", str(jobs["cks"][2, 2]), "--prompt", "def ",
                     "--max-new-tokens", "40", "--temperature", "0.8", "--top-k", "10",
                     "--seed", "3", "--json") for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    assert json.loads(runs[0].stdout)["tokens"] == tp2["tokens"]
    other = generate(str(jobs["cks"][2, 2]), **{**args, "seed": 4})
    assert other["tokens"] != tp2["tokens"]
