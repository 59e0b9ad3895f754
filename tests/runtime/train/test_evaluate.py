"""A classifier trained on a CSV with a validation split, in this process: its metric lines
carry the validation loss and accuracy, and ``ringflow evaluate`` on its checkpoint gives
them back (loss and accuracy, no perplexity); a checkpoint of a job without validation data
needs ``--data``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ringflow.evaluate import evaluate, main
from ringflow.train.metrics import parse_train_line
from tests.runtime.train.conftest import MLP_ARGS


@pytest.fixture
def csv(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, MLP_ARGS["input_size"]))
    y = np.argmax(x[:, :MLP_ARGS["num_classes"]], axis=1)
    path = tmp_path / "points.csv"
    rows = [",".join(f"{v:.6f}" for v in r) + f",{c}" for r, c in zip(x, y)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_classifier_validates_and_evaluates_to_the_same_loss_and_accuracy(
        train_here, tmp_path, csv, capsys):
    spec = {"model": "mlp", "model_args": MLP_ARGS, "dtype": "float64", "data": str(csv),
            "validation_fraction": 0.25, "eval_every": 4, "steps": 8, "log_every": 4,
            "global_batch_size": 16, "checkpoint_dir": str(tmp_path / "ck"),
            "optimizer": {"type": "adam", "learning_rate": 0.02}}
    out = train_here(spec)
    assert out.code == 0, out.stderr
    last = out.metrics[-1]
    assert last["step"] == 8 and 0.0 <= last["val_accuracy"] <= 1.0
    assert [m["step"] for m in out.metrics if "val_loss" in m] == [4, 8]
    result = evaluate(str(tmp_path / "ck"))
    assert result["val_loss"] == pytest.approx(last["val_loss"], rel=1e-10, abs=0)
    assert result["accuracy"] == last["val_accuracy"] and "perplexity" not in result
    assert result["samples"] == 30

    plain = train_here({**spec, "validation_fraction": 0.0, "checkpoint_dir":
                        str(tmp_path / "plain")})
    assert plain.code == 0 and all("val_loss" not in m for m in plain.metrics)
    assert "val_loss" not in plain.summary
    capsys.readouterr()
    assert main([str(tmp_path / "plain")]) == 2
    assert "its job had no validation data: give --data PATH" in capsys.readouterr().err
    assert main([str(tmp_path / "plain"), "--data", str(csv)]) == 0
    line = capsys.readouterr().out.strip()
    assert parse_train_line(line) is None and json.loads(line)["samples"] == 120


def test_a_non_finite_validation_loss_stops_the_job_naming_the_step(train_here, tmp_path,
                                                                    csv):
    huge = tmp_path / "huge.csv"
    huge.write_text("".join(",".join(["1e308"] * MLP_ARGS["input_size"]) + ",1\n"
                            for _ in range(4)))
    out = train_here({"model": "mlp", "model_args": MLP_ARGS, "dtype": "float64",
                      "data": str(csv), "eval_data": str(huge), "eval_every": 2, "steps": 4,
                      "global_batch_size": 8})
    assert out.code == 3, out.stdout + out.stderr
    assert "[train] error: stopping: the validation loss is inf at step 2;" in out.stderr
    assert [m["step"] for m in out.metrics] == [1]


def test_a_model_of_token_ids_generates_ids_after_an_ids_prompt(train_here, tmp_path,
                                                                capsys):
    from ringflow.generate import main as generate_main
    from tests.runtime.train.conftest import TRANSFORMER_ARGS

    out = train_here({"model": "transformer", "model_args": TRANSFORMER_ARGS, "steps": 2,
                      "global_batch_size": 4, "checkpoint_dir": str(tmp_path / "ck")})
    assert out.code == 0, out.stderr
    capsys.readouterr()
    assert generate_main([str(tmp_path / "ck"), "--prompt", "1 2 3", "--max-new-tokens",
                          "4", "--seed", "5"]) == 0
    words = capsys.readouterr().out.split()
    assert words[:3] == ["1", "2", "3"] and len(words) == 7
    assert all(0 <= int(w) < TRANSFORMER_ARGS["vocab_size"] for w in words)
    assert generate_main([str(tmp_path / "ck"), "--prompt", "hello"]) == 2
    assert "give the prompt as ids separated by spaces" in capsys.readouterr().err
