"""Sampling from a ``transformer``'s weights in numpy, one process: the model's forward pass
(the program's ops, float64) over a whole context, and the same pass one token at a time
with a key/value cache, so a new token costs one position's work instead of the prefix's.

The context window: the model has ``seq_len`` positions. When the tokens since the window
started fill it, the window restarts at the newest ``seq_len // 2`` tokens (the cached
decoder fills its cache again from them); both decoders follow this rule, so they give the
same tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_GELU_K = 0.044715
_EPS = 1e-5


def _norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _EPS) * scale + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + _GELU_K * x * x)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class Decoder:
    """A transformer's parameters (``<name>.*``, whole, any float dtype: used as float64)
    and its sizes (``config``: the builder's arguments)."""

    params: dict[str, np.ndarray]
    config: dict[str, Any]
    name: str = "gpt"
    cache: list[list[np.ndarray]] = field(default_factory=list)   # per layer [K, V]

    def __post_init__(self) -> None:
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in self.params.items()}
        self.seq_len = int(self.config["seq_len"])
        self.heads = int(self.config["num_heads"])
        self.head_dim = int(self.config["hidden_size"]) // self.heads
        self.layers = int(self.config["num_layers"])

    def _p(self, key: str) -> np.ndarray:
        return self.params[f"{self.name}.{key}"]

    def _qkv(self, x: np.ndarray, i: int) -> tuple[np.ndarray, ...]:
        """[heads, T, head_dim] each: head h's columns are its q, k and v."""
        qkv = (x @ self._p(f"{i}.attn.qkv.w")).reshape(len(x), self.heads, 3 * self.head_dim)
        return tuple(t.transpose(1, 0, 2) for t in np.split(qkv, 3, axis=2))

    def _block_out(self, h: np.ndarray, ctx: np.ndarray, i: int) -> np.ndarray:
        ctx = ctx.transpose(1, 0, 2).reshape(len(h), -1)
        h = h + ctx @ self._p(f"{i}.attn.out.w") + self._p(f"{i}.attn.out.b")
        x = _norm(h, self._p(f"{i}.ln2.scale"), self._p(f"{i}.ln2.bias"))
        m = _gelu(x @ self._p(f"{i}.mlp.fc1.w") + self._p(f"{i}.mlp.fc1.b"))
        return h + m @ self._p(f"{i}.mlp.fc2.w") + self._p(f"{i}.mlp.fc2.b")

    def _embed(self, ids: np.ndarray, first: int) -> np.ndarray:
        return self._p("embed.tok")[ids] + self._p("embed.pos")[first:first + len(ids)]

    def _head(self, h: np.ndarray) -> np.ndarray:
        return _norm(h, self._p("ln_f.scale"), self._p("ln_f.bias")) @ self._p("head.w")

    def forward(self, ids: Any, keep: bool = False) -> np.ndarray:
        """Logits [T, vocab] of a whole context (at most seq_len tokens) at positions
        0..T-1; ``keep`` fills the cache with its keys and values."""
        ids = np.asarray(ids, dtype=np.int64)
        h = self._embed(ids, 0)
        scale = 1.0 / math.sqrt(self.head_dim)
        future = np.triu(np.ones((len(ids), len(ids)), dtype=bool), 1)
        self.cache = []
        for i in range(self.layers):
            q, k, v = self._qkv(_norm(h, self._p(f"{i}.ln1.scale"), self._p(f"{i}.ln1.bias")), i)
            if keep:
                self.cache.append([k, v])
            scores = np.where(future, -np.inf, q @ k.transpose(0, 2, 1) * scale)
            h = self._block_out(h, _softmax(scores) @ v, i)
        return self._head(h)

    def step(self, token: int) -> np.ndarray:
        """Logits [vocab] of one more token after the cached ones (its position is their
        count); its keys and values join the cache."""
        position = self.cache[0][0].shape[1]
        h = self._embed(np.array([token]), position)
        scale = 1.0 / math.sqrt(self.head_dim)
        for i in range(self.layers):
            q, k, v = self._qkv(_norm(h, self._p(f"{i}.ln1.scale"), self._p(f"{i}.ln1.bias")), i)
            keys = np.concatenate([self.cache[i][0], k], axis=1)
            values = np.concatenate([self.cache[i][1], v], axis=1)
            self.cache[i] = [keys, values]
            h = self._block_out(h, _softmax(q @ keys.transpose(0, 2, 1) * scale) @ values, i)
        return self._head(h)[-1]


def sample(logits: np.ndarray, temperature: float, top_k: int | None,
           rng: np.random.Generator) -> int:
    """A token: the most likely with temperature 0, else drawn from softmax(logits / T)
    over the ``top_k`` most likely (None: all), by one uniform draw of ``rng``."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits / temperature
    if top_k is not None and top_k < len(z):
        cut = np.partition(z, len(z) - top_k)[len(z) - top_k]
        z = np.where(z < cut, -np.inf, z)
    p = _softmax(z)
    return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"),
                   len(p) - 1))


def generate(decoder: Decoder, prompt: Any, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, seed: int = 0, cached: bool = True,
             vocab: int | None = None) -> list[int]:
    """``max_new_tokens`` tokens after ``prompt`` (at least one token). ``cached=False``
    computes every token's logits from its whole context (the reference the cache is
    checked against). ``vocab``: sample only tokens below it (a tokenizer's vocabulary may
    be smaller than the model's: a char vocabulary of 90 in a model of 128)."""
    ids = [int(t) for t in np.asarray(prompt).reshape(-1)]
    if not ids:
        raise ValueError("generate needs a prompt of at least one token")
    rng = np.random.default_rng(seed)
    half = max(decoder.seq_len // 2, 1)
    start = max(0, len(ids) - decoder.seq_len)
    logits = decoder.forward(ids[start:], keep=cached)[-1] if max_new_tokens else None
    out = []
    for n in range(max_new_tokens):
        token = sample(logits[:vocab], temperature, top_k, rng)
        ids.append(token)
        out.append(token)
        if n == max_new_tokens - 1:
            break
        if len(ids) - start > decoder.seq_len:      # the window is full: restart it
            start = len(ids) - half
            logits = decoder.forward(ids[start:], keep=cached)[-1]
        elif cached:
            logits = decoder.step(token)
        else:
            logits = decoder.forward(ids[start:])[-1]
    return out
