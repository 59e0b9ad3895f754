"""Property: whatever job spec a training host reads (generated ones: every field
with values of every JSON type, hostile strings, unknown fields), `JobSpec.from_dict` either
refuses it with a ConfigError naming the field, or takes a spec that reads back from its JSON
as itself, whose layout check refuses only with a ConfigError naming a field, and whose
optimizer builds. No other exception comes out (that would be a traceback on every rank).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringflow.errors import ConfigError
from ringflow.train.spec import JobSpec
from tests.hostile import PROPERTY_SETTINGS, anything, text_or

pytestmark = pytest.mark.slow

FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))
_SMALL = st.one_of(st.integers(-2, 9), st.sampled_from([1.5, True, None, "2", 2**70]))
VALID = {
    "model": st.sampled_from(["mlp", "transformer", "pkg.mod:build"]),
    "model_args": st.sampled_from([{}, {"hidden_size": 8}, {"num_layers": 1, "num_heads": 2},
                                   {"dropout": 0.1}]),
    "data": st.sampled_from(["synthetic", "/data/x.npz", "/data/corpus.txt", "/data/corpus",
                             "/data/tokens.npy", "/data/rows.csv"]),
    "tokenizer": st.sampled_from(["byte", "char"]),
    "validation_fraction": st.sampled_from([0.0, 0.1, 0.5]),
    "eval_data": st.sampled_from([None, "/data/val.txt", "/data/val.npz"]),
    "eval_every": st.integers(1, 3),
    "optimizer": st.sampled_from([{"type": "sgd", "learning_rate": 0.1},
                                  {"type": "adam", "learning_rate": 1e-3, "beta1": 0.8},
                                  {"type": "momentum", "learning_rate": 0.1,
                                   "momentum": 0.9}]),
    "lr_schedule": st.sampled_from([None, {"type": "cosine"},
                                    {"type": "step", "step_size": 2, "gamma": 0.5}]),
    "grad_clip": st.sampled_from([None, 1.0]),
    "steps": st.integers(1, 5), "global_batch_size": st.sampled_from([4, 8]),
    "seed": st.integers(0, 3), "tensor_parallel_degree": st.sampled_from([1, 2]),
    "dtype": st.sampled_from(["float32", "float64"]), "log_every": st.integers(1, 3),
    "checkpoint_dir": st.sampled_from([None, "/tmp/ck", "ck dir"]),
    "checkpoint_every": st.integers(1, 3), "resume": st.booleans(), "amp": st.booleans(),
    "recompute": st.sampled_from([False, True, ["h_0"]]),
    "sharding_stage": st.integers(0, 2),
    "gradient_accumulation_steps": st.integers(1, 2),
}
_KEYS = text_or("type", "learning_rate", "beta1", "momentum", "hidden_size", "step_size",
                "warmup_steps", "eta_min", "gamma", "dropout")
HOSTILE = {
    **{name: st.one_of(anything(), _SMALL) for name in FIELDS},
    "model": text_or("mlp", "transformer", "pkg.mod:build", "os:system"),
    "model_args": st.dictionaries(_KEYS, st.one_of(_SMALL, anything()), max_size=3),
    "optimizer": st.dictionaries(_KEYS, st.one_of(_SMALL, anything(), text_or("sgd", "adam",
                                                                            "lamb")),
                                 max_size=3),
    "lr_schedule": st.dictionaries(_KEYS, st.one_of(_SMALL, text_or("cosine", "step")),
                                   max_size=3),
    "data": text_or("synthetic", "/data/x.npz", "/data/corpus.txt"),
    "tokenizer": text_or("byte", "char"),
    "eval_data": text_or("/data/val.txt", "synthetic"),
    "checkpoint_dir": text_or("/tmp/ck"),
}


@st.composite
def specs(draw) -> dict:
    """Some fields valid, one or two hostile, sometimes an unknown one."""
    chosen = draw(st.sets(st.sampled_from(FIELDS), max_size=6))
    spec = {name: draw(VALID[name]) for name in sorted(chosen)}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=2, unique=True)):
        spec[name] = draw(HOSTILE[name])
    if draw(st.integers(0, 9)) == 0:
        spec[draw(text_or("stpes", "extra"))] = draw(_SMALL)
    return spec


@PROPERTY_SETTINGS
@given(spec=specs(), layout=st.sampled_from([(1, 1), (2, 2), (4, 2), (3, 3)]))
def test_a_job_spec_is_refused_by_name_or_reads_back_as_itself(spec, layout):
    try:
        job = JobSpec.from_dict(spec)
    except ConfigError as exc:
        message = str(exc)
        assert any(name in message for name in (*FIELDS, *map(repr, spec))), message
        return
    text = json.dumps(job.to_dict(), allow_nan=False)
    assert "\n" not in text
    assert JobSpec.from_dict(json.loads(text)) == job
    job.build_optimizer()
    world, nproc = layout
    try:
        job.check_layout(world, nproc)
    except ConfigError as exc:
        assert any(name in str(exc) for name in ("tensor_parallel_degree", "global_batch_size",
                                                 "model_args", "world size")), str(exc)


@pytest.mark.parametrize(("field", "value"), [("checkpoint_dir", "ck\0"),
                                              ("data", "/data/x\0.npz"),
                                              ("eval_data", "/data/v\0.txt")])
def test_a_path_with_a_nul_is_refused_naming_the_field(field, value):
    """The OS cannot take it as a path: every rank would fail with a ValueError."""
    with pytest.raises(ConfigError, match=f"{field} must be a path"):
        JobSpec.from_dict({field: value})
