"""Built-in models: parameter names independent of the degree, serial training that learns,
synthetic batches that depend only on (seed, step, batch size), and argument errors."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError
from ringflow.models import mlp, transformer

SMALL_TRANSFORMER = dict(vocab_size=32, seq_len=8, hidden_size=16, num_heads=4, num_layers=2)


def _train(builder, steps: int, lr: float, **kwargs) -> list[float]:
    main, startup = rf.Program(), rf.Program()
    startup.random_seed = 1
    with rf.program_guard(main, startup):
        model = builder(**kwargs)
        rf.optimizer.Adam(lr).minimize(model.loss)
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(startup, scope=scope)
    return [float(exe.run(main, feed=model.make_batch(0, s, 32), fetch_list=[model.loss],
                          scope=scope)[0].reshape(-1)[0]) for s in range(steps)]


def test_mlp_learns_its_synthetic_task():
    losses = _train(mlp, 150, 3e-3, input_size=16, hidden_size=64, num_classes=4)
    assert losses[0] > 1.2 and np.mean(losses[-10:]) < 0.5 * losses[0]


def test_transformer_learns_its_recurrence():
    losses = _train(transformer, 80, 1e-2, **SMALL_TRANSFORMER)
    assert losses[0] > 3.0      # about log(32) at the start
    assert np.mean(losses[-10:]) < 0.5


def _param_names(builder, **kwargs) -> list[str]:
    main = rf.Program()
    with rf.program_guard(main, rf.Program()):
        model = builder(**kwargs)
    assert model.feeds == [v.name for v in main.global_block().vars.values() if v.is_data]
    return [p.name for p in main.all_parameters()]


def test_parameters_are_named_explicitly():
    assert _param_names(mlp, num_layers=2) == [
        "mlp.0.fc1.w", "mlp.0.fc1.b", "mlp.0.fc2.w", "mlp.0.fc2.b",
        "mlp.1.fc1.w", "mlp.1.fc1.b", "mlp.1.fc2.w", "mlp.1.fc2.b"]
    names = _param_names(transformer, **{**SMALL_TRANSFORMER, "num_layers": 1})
    assert names == [
        "gpt.embed.tok", "gpt.embed.pos", "gpt.0.ln1.scale", "gpt.0.ln1.bias",
        "gpt.0.attn.qkv.w", "gpt.0.attn.out.w", "gpt.0.attn.out.b", "gpt.0.ln2.scale",
        "gpt.0.ln2.bias", "gpt.0.mlp.fc1.w", "gpt.0.mlp.fc1.b", "gpt.0.mlp.fc2.w",
        "gpt.0.mlp.fc2.b", "gpt.ln_f.scale", "gpt.ln_f.bias", "gpt.head.w"]


@pytest.mark.parametrize("builder, kwargs", [(mlp, {}), (transformer, SMALL_TRANSFORMER)],
                         ids=["mlp", "transformer"])
def test_a_batch_depends_only_on_seed_step_and_size(builder, kwargs):
    with rf.program_guard(rf.Program(), rf.Program()):
        model = builder(**kwargs)
    a, b = model.make_batch(3, 5, 16), model.make_batch(3, 5, 16)
    for name in model.feeds:
        np.testing.assert_array_equal(a[name], b[name])
    assert any(not np.array_equal(a[n], model.make_batch(3, 6, 16)[n]) for n in model.feeds)
    assert any(not np.array_equal(a[n], model.make_batch(4, 5, 16)[n]) for n in model.feeds)


def test_transformer_labels_are_the_next_tokens():
    with rf.program_guard(rf.Program(), rf.Program()):
        model = transformer(**SMALL_TRANSFORMER)
    batch = model.make_batch(0, 0, 4)
    np.testing.assert_array_equal(batch["labels"][:, :-1], batch["tokens"][:, 1:])
    assert batch["tokens"].dtype == np.int64 and batch["tokens"].shape == (4, 8)


@pytest.mark.parametrize("builder, kwargs, message", [
    (mlp, {"hidden_size": 30, "mp_degree": 4}, "hidden_size=30 is not divisible by mp_degree=4"),
    (mlp, {"num_layers": 0}, "num_layers must be an integer >= 1, got 0"),
    (mlp, {"dtype": "float16"}, "dtype must be float32 or float64, got float16"),
    (transformer, {"num_heads": 3}, "hidden_size=64 is not divisible by num_heads=3"),
    (transformer, {"num_heads": 2, "mp_degree": 4}, "num_heads=2 is not divisible by "
                                                    "mp_degree=4"),
    (transformer, {"vocab_size": 30, "mp_degree": 4}, "vocab_size=30 is not divisible"),
])
def test_model_arguments_are_checked_by_name(builder, kwargs, message):
    with pytest.raises(ConfigError, match=message), \
            rf.program_guard(rf.Program(), rf.Program()):
        builder(**kwargs)
