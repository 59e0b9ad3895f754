"""JobSpec: the issue's fields and defaults, validation errors that name the field and the
value (table-driven), the layout check, JSON in and out, and what the provider introspects."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from ringflow.errors import ConfigError
from ringflow.train.spec import FIELD_DOCS, FIELD_MAXIMUMS, FIELD_MINIMUMS, JobSpec

DEFAULTS = {
    "model": "transformer", "model_args": {}, "data": "synthetic", "tokenizer": "byte",
    "validation_fraction": 0.0, "eval_data": None, "eval_every": 100,
    "optimizer": {"type": "adam", "learning_rate": 1e-3}, "lr_schedule": None,
    "grad_clip": None, "steps": 200, "global_batch_size": 32, "seed": 0,
    "tensor_parallel_degree": 1, "dtype": "float32", "log_every": 10,
    "checkpoint_dir": None, "checkpoint_every": 100, "resume": True, "amp": False,
    "recompute": False, "sharding_stage": 0, "gradient_accumulation_steps": 1,
}

# (fields given, the message the ConfigError must contain)
INVALID = [
    ({"sharding_stage": 3}, "sharding_stage must be an integer in 0..2, got 3"),
    ({"sharding_stage": -1}, "sharding_stage must be an integer in 0..2, got -1"),
    ({"sharding_stage": True}, "sharding_stage must be an integer in 0..2, got True"),
    ({"amp": "yes"}, "amp must be true or false, got 'yes'"),
    ({"amp": True, "dtype": "float64"}, "amp trains float32 models"),
    ({"recompute": "all"}, "recompute must be true, false or a non-empty list of checkpoint "
                           "variable names, got 'all'"),
    ({"recompute": []}, "recompute must be true, false or a non-empty list"),
    ({"recompute": ["h", 3]}, "recompute must be true, false or a non-empty list"),
    ({"steps": 0}, "steps must be an integer >= 1, got 0"),
    ({"steps": 2.5}, "steps must be an integer >= 1, got 2.5"),
    ({"steps": True}, "steps must be an integer >= 1, got True"),
    ({"global_batch_size": "32"}, "global_batch_size must be an integer >= 1, got '32'"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"tensor_parallel_degree": 0}, "tensor_parallel_degree must be an integer >= 1, got 0"),
    ({"log_every": 0}, "log_every must be an integer >= 1, got 0"),
    ({"checkpoint_every": None}, "checkpoint_every must be an integer >= 1, got None"),
    ({"dtype": "float16"}, "dtype must be float32 or float64, got 'float16'"),
    ({"resume": "yes"}, "resume must be true or false, got 'yes'"),
    ({"grad_clip": 0}, "grad_clip must be a number > 0 or null, got 0"),
    ({"grad_clip": "1"}, "grad_clip must be a finite number, got '1'"),
    ({"checkpoint_dir": ""}, "checkpoint_dir must be a non-empty string, got ''"),
    ({"data": " "}, "data must be a non-empty string, got ' '"),
    ({"tokenizer": "bpe"}, "tokenizer must be byte or char, got 'bpe'"),
    ({"validation_fraction": 1}, "validation_fraction must be in [0, 1), got 1"),
    ({"validation_fraction": -0.1}, "validation_fraction must be >= 0.0, got -0.1"),
    ({"eval_every": 0}, "eval_every must be an integer >= 1, got 0"),
    ({"data": "a.txt", "validation_fraction": 0.1, "eval_data": "b.txt"},
     "give validation_fraction or eval_data, not both"),
    ({"validation_fraction": 0.1}, "validation_fraction holds out part of a data file; "
                                   "synthetic data has none: give eval_data"),
    ({"model": "resnet"}, "model must be mlp, transformer or package.module:build_fn, got "
                          "'resnet'"),
    ({"model": "pkg.mod:"}, "got 'pkg.mod:'"),
    ({"model_args": [1]}, "model_args must be an object of builder arguments, got [1]"),
    ({"model": "mlp", "model_args": {"hidden": 8}},
     "model_args: unknown argument 'hidden' for mlp (did you mean 'hidden_size'?) (it takes "
     "input_size, hidden_size, num_classes, num_layers, dropout, name)"),
    ({"model_args": {"num_heads": 0}}, "model_args.num_heads must be an integer >= 1, got 0"),
    ({"model_args": {"dropout": 1.0}}, "model_args.dropout must be in [0, 1), got 1.0"),
    ({"model_args": {"mp_degree": 2}},
     "model_args.mp_degree cannot be set: the spec's tensor_parallel_degree sets it"),
    ({"model": "pkg.mod:fn", "model_args": {"f": {1, 2}}}, "model_args must hold JSON values"),
    ({"optimizer": "adam"}, "optimizer must be an object with a 'type'"),
    ({"optimizer": {"type": "rmsprop"}},
     "optimizer.type must be one of sgd, momentum, adam, adamw, lamb, lars, got 'rmsprop'"),
    ({"optimizer": {"type": ["adam"]}}, "optimizer.type must be one of sgd, momentum, adam, "
                                        "adamw, lamb, lars, got ['adam']"),
    ({"optimizer": {"type": "adam", "beta3": 0.9}},
     "optimizer: unknown argument 'beta3' for adam"),
    ({"optimizer": {"type": "sgd", "momentum": 0.9}},
     "optimizer: unknown argument 'momentum' for sgd"),
    ({"optimizer": {"type": "adam", "grad_clip": 1.0}},
     "optimizer.grad_clip cannot be set in a job spec: use the spec's grad_clip field"),
    ({"optimizer": {"type": "adam", "learning_rate": "fast"}},
     "optimizer.learning_rate must be a finite number, got 'fast'"),
    ({"optimizer": {"type": "adam", "learning_rate": -0.1}},
     "optimizer.learning_rate must be >= 0.0, got -0.1"),
    ({"optimizer": {"type": "momentum", "use_nesterov": 1}},
     "optimizer.use_nesterov must be true or false, got 1"),
    ({"optimizer": {"type": "adam", "beta1": 1.5}}, "Adam: beta1 must be in [0.0, 1.0), got 1.5"),
    ({"optimizer": {"type": "lars", "learning_rate": 0.1}}, "optimizer: lars needs momentum"),
    ({"lr_schedule": {"type": "exponential"}},
     "lr_schedule.type must be one of cosine, step, linear_warmup, got 'exponential'"),
    ({"lr_schedule": {"type": "step"}}, "lr_schedule: step needs step_size"),
    ({"lr_schedule": "cosine"}, "lr_schedule must be null or an object with a 'type', got "
                                "'cosine'"),
    ({"lr_schedule": {"type": "cosine", "T_max": 0}},
     "lr_schedule.T_max must be an integer >= 1, got 0"),
    ({"lr_schedule": {"type": "cosine", "learning_rate": 1.0}},
     "lr_schedule: unknown argument 'learning_rate' for cosine (it takes T_max, eta_min)"),
    ({"lr_schedule": {"type": "step", "step_size": 5, "gamma": 2.0}},
     "StepDecay: gamma must be < 1.0, got 2.0"),
    ({"lr_schedule": {"type": "linear_warmup", "warmup_steps": 5,
                      "after": {"type": "linear_warmup"}}},
     "lr_schedule.after.type must be one of cosine, step, got 'linear_warmup'"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be an integer >= 1"),
    ({"gradient_accumulation_steps": 2, "amp": True},
     "gradient_accumulation_steps 2 does not combine with amp"),
    ({"gradient_accumulation_steps": 2, "sharding_stage": 1},
     "gradient_accumulation_steps 2 does not combine with sharding"),
]


@pytest.mark.parametrize("fields, message", INVALID, ids=[m[:48] for _, m in INVALID])
def test_an_invalid_field_is_a_config_error_naming_field_and_value(fields, message):
    with pytest.raises(ConfigError) as err:
        JobSpec.from_dict(fields)
    assert message in str(err.value)


@pytest.mark.parametrize("recompute", [True, False, ["mlp.h0", "mlp.h1"]])
def test_recompute_is_a_flag_or_checkpoint_names_and_round_trips(recompute):
    spec = JobSpec.from_dict({"recompute": recompute, "amp": True})
    assert spec.recompute == recompute and spec.amp is True
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_the_defaults_are_the_issues():
    assert JobSpec().to_dict() == DEFAULTS
    assert JobSpec.from_dict({}) == JobSpec()


def test_an_unknown_field_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match="unknown field 'stepz' in the job spec "
                                          r"\(did you mean 'steps'\?\)"):
        JobSpec.from_dict({"stepz": 10})


def test_a_spec_round_trips_through_json():
    spec = JobSpec.from_dict({
        "model": "mlp", "model_args": {"hidden_size": 64, "dropout": 0.1},
        "optimizer": {"type": "lars", "learning_rate": 0.1, "momentum": 0.9,
                      "exclude_from_weight_decay": ["b"]},
        "lr_schedule": {"type": "linear_warmup", "warmup_steps": 5,
                        "after": {"type": "cosine", "eta_min": 1e-5}},
        "grad_clip": 1, "checkpoint_dir": "/tmp/ck", "resume": False})
    assert spec.grad_clip == 1.0 and isinstance(spec.grad_clip, float)
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_from_json_file_reads_a_spec_and_names_bad_json(tmp_path):
    good = tmp_path / "good.json"
    good.write_text('{"steps": 7, "model": "mlp"}')
    assert JobSpec.from_json_file(good) == JobSpec(steps=7, model="mlp")
    bad = tmp_path / "bad.json"
    bad.write_text('{"steps": 7,}')
    with pytest.raises(ConfigError, match=f"job spec '{bad}' is not valid JSON: .*line 1"):
        JobSpec.from_json_file(bad)
    with pytest.raises(ConfigError, match=r"cannot read the job spec .*missing\.json"):
        JobSpec.from_json_file(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="a job spec must be a JSON object, got list"):
        JobSpec.from_json_file(tmp_path / "list.json")


@pytest.mark.parametrize("fields, world, per_host, message", [
    ({"tensor_parallel_degree": 2}, 3, 3,
     "tensor_parallel_degree 2 does not divide the ranks per host 3"),
    ({"tensor_parallel_degree": 4}, 4, 2,
     "tensor_parallel_degree 4 does not divide the ranks per host 2"),
    ({"global_batch_size": 6}, 4, 4,
     "global_batch_size 6 is not divisible by the data-parallel degree 4 (world size 4 / "
     "tensor_parallel_degree 1)"),
    ({"global_batch_size": 3, "tensor_parallel_degree": 2}, 4, 4,
     "global_batch_size 3 is not divisible by the data-parallel degree 2"),
    ({"model": "mlp", "model_args": {"hidden_size": 30}, "tensor_parallel_degree": 4}, 4, 4,
     "model_args.hidden_size 30 is not divisible by tensor_parallel_degree 4"),
    ({"global_batch_size": 6, "gradient_accumulation_steps": 2}, 2, 2,
     "global_batch_size 6 is not divisible by gradient_accumulation_steps 2 x the "
     "data-parallel degree 2"),
    ({"tensor_parallel_degree": 8}, 8, 8,   # the default transformer has 4 heads
     "model_args.num_heads 4 is not divisible by tensor_parallel_degree 8"),
])
def test_check_layout_names_both_numbers(fields, world, per_host, message):
    spec = JobSpec.from_dict(fields)
    with pytest.raises(ConfigError) as err:
        spec.check_layout(world, per_host)
    assert message in str(err.value)


def test_check_layout_accepts_fitting_layouts():
    JobSpec(tensor_parallel_degree=2, global_batch_size=6).check_layout(6, 2)   # dp 3
    JobSpec(model="mlp", tensor_parallel_degree=4).check_layout(8, 4)
    JobSpec(global_batch_size=1).check_layout(1, 1)


def test_fields_are_introspectable_with_real_types_and_documented():
    fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    assert list(fields) == list(DEFAULTS)
    assert set(FIELD_DOCS) == set(fields)
    assert fields["steps"].type is int
    assert fields["grad_clip"].type == (float | None)
    assert typing.get_args(fields["dtype"].type) == ("float32", "float64")
    assert FIELD_MINIMUMS == {"steps": 1, "global_batch_size": 1, "seed": 0,
                              "tensor_parallel_degree": 1, "log_every": 1,
                              "checkpoint_every": 1, "sharding_stage": 0,
                              "eval_every": 1, "gradient_accumulation_steps": 1}
    assert FIELD_MAXIMUMS == {"sharding_stage": 2}
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobSpec().steps = 3  # type: ignore[misc]


def test_build_optimizer_gives_the_named_optimizer_with_schedule_and_clip():
    spec = JobSpec(optimizer={"type": "momentum", "learning_rate": 0.5, "momentum": 0.8},
                   lr_schedule={"type": "step", "step_size": 2, "gamma": 0.5}, grad_clip=2.0,
                   steps=10)
    opt = spec.build_optimizer()
    assert type(opt).__name__ == "Momentum" and opt._momentum == 0.8
    assert opt._grad_clip.clip_norm == 2.0
    sched = opt._learning_rate
    rates = []
    for _ in range(5):
        rates.append(sched())
        sched.step()
    assert rates == [0.5, 0.5, 0.25, 0.25, 0.125]


def test_cosine_defaults_to_the_target_and_warmup_ends_at_the_learning_rate():
    cos = JobSpec(steps=10, lr_schedule={"type": "cosine"}).build_optimizer()._learning_rate
    assert cos.T_max == 10
    warm = JobSpec(steps=10, optimizer={"type": "sgd", "learning_rate": 0.2},
                   lr_schedule={"type": "linear_warmup", "warmup_steps": 4,
                                "after": {"type": "cosine"}}).build_optimizer()._learning_rate
    rates = []
    for _ in range(10):
        rates.append(warm())
        warm.step()
    assert rates[:5] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    assert warm.learning_rate.T_max == 6 and rates[9] < rates[5]
