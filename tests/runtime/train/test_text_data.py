"""Real data for the runtime: tokenizers (bytes; a char vocabulary from the corpus), a text
file or folder read as one token stream, windows of seq_len + 1 whose global batch is the
data-parallel ranks' rows put together, an .npy token stream memory-mapped, a CSV of
features and labels, validation splits and sets; and the numpy decoder that generation
uses: its forward pass is the program's, and its cached pass the uncached one's."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError
from ringflow.models import decode, mlp, transformer
from ringflow.train import text
from ringflow.train.data import (
    TokenWindows,
    local_rows,
    open_data,
    read_csv,
    token_eval_set,
)
from ringflow.train.spec import JobSpec


def _feeds(builder, **args):
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 3
    with rf.program_guard(main, startup):
        model = builder(**args)
    return main, startup, model, {n: main.global_block().var(n) for n in model.feeds}


def test_byte_and_char_tokenizers_read_text_back():
    sample = "Grüße, ringflow!\n"
    byte = text.Tokenizer("byte")
    assert byte.vocab_size == 256
    assert len(byte.encode(sample)) == len(sample.encode()) and byte.decode(
        byte.encode(sample)) == sample
    char = text.char_tokenizer(sample)
    assert char.chars == "".join(sorted(set(sample))) and char.vocab_size == len(set(sample))
    assert char.decode(char.encode(sample)) == sample
    assert text.Tokenizer.from_dict(char.to_dict()) == char
    with pytest.raises(ConfigError, match="'z', which is not in the model's char vocab"):
        char.encode("zz")


def test_a_folder_is_its_files_in_path_order_joined_by_newlines(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / ".hidden").write_text("never")
    (tmp_path / "c.md").write_text("third\n")
    assert text.read_text(str(tmp_path)) == "first\nsecond\nthird\n"
    (tmp_path / "d.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"d\.bin' is not UTF-8 text"):
        text.read_text(str(tmp_path))


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_text_windows_of_a_step_are_the_dp_ranks_rows_put_together(dp):
    tokens = np.arange(1000, dtype=np.int64) % 97
    data = TokenWindows(tokens, 8, ("tokens", "labels"), seed=4, global_batch_size=8)
    for step in (0, 1, 7):
        whole = data.batch(step, slice(0, 8))
        parts = [data.batch(step, local_rows(8, r, dp)) for r in range(dp)]
        for name in ("tokens", "labels"):
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]),
                                          whole[name])
        np.testing.assert_array_equal(whole["labels"][:, :-1], whole["tokens"][:, 1:])
        starts = whole["tokens"][:, 0]
        np.testing.assert_array_equal(whole["tokens"], tokens[starts[:, None] + np.arange(8)])
    again = TokenWindows(tokens, 8, ("tokens", "labels"), seed=4, global_batch_size=8)
    assert (again.batch(3, slice(0, 8))["tokens"] == data.batch(3, slice(0, 8))["tokens"]).all()
    assert (data.starts(3) != data.starts(4)).any()


def test_text_validation_is_the_tail_in_consecutive_windows(tmp_path):
    corpus = "".join(chr(ord("a") + i % 26) for i in range(2000))
    (tmp_path / "c.txt").write_text(corpus)
    _, _, model, feeds = _feeds(transformer, vocab_size=64, seq_len=8, hidden_size=8,
                                num_heads=2, num_layers=1)
    spec = JobSpec(data=str(tmp_path / "c.txt"), tokenizer="char", validation_fraction=0.1)
    sources = open_data(spec, feeds, model.make_batch, 64)
    tok = sources.tokenizer
    assert tok.chars == "abcdefghijklmnopqrstuvwxyz"
    assert len(sources.train.tokens) == 1800
    assert tok.decode(sources.train.tokens) == corpus[:1800]
    evals = sources.eval
    assert evals.count == (200 - 1) // 8 and evals.tokens_per_sample == 8
    first = evals.take(np.arange(evals.count))
    assert tok.decode(first["tokens"].reshape(-1)) == corpus[1800:1800 + 8 * evals.count]
    np.testing.assert_array_equal(first["labels"].reshape(-1),
                                  tok.encode(corpus[1801:1801 + 8 * evals.count]))
    with pytest.raises(ConfigError, match="more than the model's vocab_size 16"):
        open_data(spec, feeds, model.make_batch, 16)


def test_an_npy_token_stream_is_memory_mapped(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, (np.arange(5000) % 50).astype(np.uint16))
    _, _, model, feeds = _feeds(transformer, vocab_size=64, seq_len=8, hidden_size=8,
                                num_heads=2, num_layers=1)
    sources = open_data(JobSpec(data=str(path)), feeds, model.make_batch, 64)
    assert isinstance(sources.train.tokens, np.memmap) and sources.tokenizer.kind == "ids"
    batch = sources.train.batch(0, slice(0, 4))
    assert batch["tokens"].dtype == np.int64
    np.testing.assert_array_equal(batch["labels"], (batch["tokens"] + 1) % 50)
    with pytest.raises(ConfigError, match=r"token ids must be in \[0, 32\)"):
        open_data(JobSpec(data=str(path)), feeds, model.make_batch, 32)
    with pytest.raises(ConfigError, match="fed tokens and labels"):
        open_data(JobSpec(data=str(path)), _feeds(mlp)[3], None, None)


def test_a_csv_is_features_and_a_last_column_of_labels_split_by_the_seed(tmp_path):
    rows = [[i, i * 0.5, i % 3] for i in range(20)]
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    _, _, model, feeds = _feeds(mlp, input_size=2, hidden_size=4, num_classes=3)
    arrays = read_csv(str(path), feeds)
    np.testing.assert_array_equal(arrays["x"], np.array(rows, dtype=np.float32)[:, :2])
    assert arrays["y"].dtype == np.int64 and list(arrays["y"]) == [r[2] for r in rows]
    spec = JobSpec(model="mlp", data=str(path), validation_fraction=0.25, seed=2)
    sources = open_data(spec, feeds, model.make_batch, None)
    held = sources.eval.take(np.arange(sources.eval.count))["x"][:, 0]
    train = sources.train.arrays["x"][np.arange(sources.train.rows_total)][:, 0]
    assert len(held) == 5 and len(train) == 15
    assert sorted(np.concatenate([held, train])) == list(range(20))
    other = open_data(JobSpec(model="mlp", data=str(path), validation_fraction=0.25,
                              seed=3), feeds, model.make_batch, None)
    assert list(other.eval.take(np.arange(5))["x"][:, 0]) != list(held)
    (tmp_path / "bad.csv").write_text("1,2,0.5\n")
    with pytest.raises(ConfigError, match="the last column is the label, an integer class"):
        read_csv(str(tmp_path / "bad.csv"), feeds)


TINY = dict(vocab_size=24, seq_len=8, hidden_size=16, num_heads=4, num_layers=2)


@pytest.fixture(scope="module")
def trained_free():
    """A float64 transformer's initial weights and its forward program (one process)."""
    main, startup, model, _ = _feeds(transformer, dtype="float64", **TINY)
    test = main.clone(for_test=True)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    params = {p.name: np.array(scope[p.name]) for p in main.global_block().iter_parameters()}
    # the fresh weights predict almost uniformly: give the model something to say
    rng = np.random.default_rng(0)
    for name in params:
        params[name] = params[name] + rng.normal(0, 0.3, params[name].shape)
        scope[name] = params[name]
    return test, model, exe, scope, params


def test_the_decoders_forward_is_the_programs(trained_free):
    test, model, exe, scope, params = trained_free
    tokens = np.random.default_rng(1).integers(0, 24, (3, 8))
    losses, = exe.run(test, feed={"tokens": tokens, "labels": np.roll(tokens, -1, axis=1)},
                      fetch_list=[model.outputs["sample_loss"]], scope=scope)
    decoder = decode.Decoder(params, model.config)
    mine = []
    for row in range(3):
        logits = decoder.forward(tokens[row])
        logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1,
                               keepdims=True)) - logits.max(1, keepdims=True)
        mine.append(-logp[np.arange(8), np.roll(tokens[row], -1)])
    np.testing.assert_allclose(np.concatenate(mine), losses.reshape(-1), rtol=1e-10, atol=0)


def test_cached_generation_is_uncached_generation_token_for_token(trained_free):
    _, model, _, _, params = trained_free
    decoder = decode.Decoder(params, model.config)
    prompt = [3, 1, 4]
    cached = decode.Decoder(params, model.config)
    logits = cached.forward(prompt, keep=True)[-1]
    for token in (5, 9, 2, 6):   # the cache's logits are the whole context's
        prompt.append(token)
        logits = cached.step(token)
        np.testing.assert_allclose(logits, decoder.forward(prompt)[-1], rtol=1e-10,
                                   atol=1e-12)
    # 30 tokens pass the 8-position window several times (each a restart of the window)
    for temperature, top_k in ((0.0, None), (1.0, 5), (0.7, None)):
        runs = [decode.generate(decoder, [3, 1, 4], 30, temperature, top_k, seed=7,
                                cached=c) for c in (True, False, True)]
        assert runs[0] == runs[1] == runs[2], (temperature, top_k)
        assert len(runs[0]) == 30 and all(0 <= t < 24 for t in runs[0])
    # a tokenizer's vocabulary smaller than the model's: only its tokens come
    limited = decode.generate(decoder, [3, 1, 4], 200, 5.0, None, seed=7, vocab=10)
    assert max(limited) < 10 and len(set(limited)) > 5
    other = decode.generate(decoder, [3, 1, 4], 30, 1.0, 5, seed=8)
    assert other != decode.generate(decoder, [3, 1, 4], 30, 1.0, 5, seed=7)


def test_top_k_one_and_temperature_zero_are_the_most_likely_token():
    rng = np.random.default_rng(0)
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    assert decode.sample(logits, 0.0, None, rng) == 1
    assert {decode.sample(logits, 5.0, 1, rng) for _ in range(20)} == {1}
    assert {decode.sample(logits, 5.0, 2, rng) for _ in range(200)} == {1, 3}


def test_consecutive_eval_windows_predict_every_token_once():
    tokens = np.arange(35)
    evals = token_eval_set(tokens, 8, ("tokens", "labels"))
    batch = evals.take(np.arange(evals.count))
    assert evals.count == 4
    np.testing.assert_array_equal(batch["labels"].reshape(-1), np.arange(1, 33))
