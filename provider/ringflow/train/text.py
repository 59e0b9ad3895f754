"""Text for the transformer: tokenizers (bytes, vocabulary 256, or the characters of the
corpus, a vocabulary stored with the checkpoint), reading a UTF-8 file or a folder of them
as one token stream, and ``.npy`` token streams memory-mapped (a corpus larger than memory
trains)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

TOKENIZERS = ("byte", "char")


@dataclass(frozen=True)
class Tokenizer:
    """``byte``: token = a byte of the UTF-8 text (vocabulary 256, nothing to store);
    ``char``: token = the index of a character in ``chars``, the sorted characters of the
    corpus (stored with the checkpoint, so evaluation and generation read text the same);
    ``ids``: the data is token ids already (an ``.npy`` stream, or synthetic), there is no
    text: a prompt is written as the ids, separated by spaces."""

    kind: str
    chars: str = ""

    @property
    def vocab_size(self) -> int | None:
        return {"byte": 256, "char": len(self.chars)}.get(self.kind)

    def encode(self, text: str) -> np.ndarray:
        """The int64 token ids of ``text``; a character outside a char vocabulary is a
        ConfigError naming it."""
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        if self.kind != "char":
            return _parse_ids(text)
        points = _code_points(text)
        table = _code_points(self.chars)
        ids = np.searchsorted(table, points)
        bad = (ids >= len(table)) | (table[np.minimum(ids, len(table) - 1)] != points)
        if bad.any():
            char = chr(int(points[np.argmax(bad)]))
            raise ConfigError(f"the text has the character {char!r}, which is not in the "
                              f"model's char vocabulary of {len(table)} characters")
        return ids.astype(np.int64)

    def decode(self, ids: Any) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if self.kind == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        if self.kind == "char":
            return "".join(self.chars[i] for i in ids)
        return " ".join(map(str, ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": self.chars} if self.kind == "char" \
            else {"kind": self.kind}

    @classmethod
    def from_dict(cls, value: dict[str, Any] | None) -> Tokenizer:
        if not value:
            return cls("byte")
        return cls(str(value["kind"]), str(value.get("chars", "")))


def _parse_ids(text: str) -> np.ndarray:
    try:
        return np.array([int(t) for t in text.split()], dtype=np.int64)
    except ValueError:
        raise ConfigError(f"this model reads token ids, not text (it was trained on an .npy "
                          f"token stream or synthetic data): give the prompt as ids separated "
                          f"by spaces, got {text!r}") from None


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def char_tokenizer(text: str) -> Tokenizer:
    """The vocabulary of ``text``'s characters, sorted by code point."""
    return Tokenizer("char", "".join(map(chr, np.unique(_code_points(text)).tolist())))


def text_files(path: str) -> list[str]:
    """``path`` itself, or every file under the folder ``path`` (hidden names skipped), in
    sorted order of their paths relative to it."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ConfigError(f"data {path!r}: no such file or folder")
    found = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(folder, f) for f in sorted(files) if not f.startswith(".")]
    if not found:
        raise ConfigError(f"data {path!r}: the folder holds no files")
    return sorted(found, key=lambda f: os.path.relpath(f, path))


def read_text(path: str) -> str:
    """A UTF-8 file, or a folder's files joined (a newline between two files where the
    first does not end in one); a file that is not UTF-8 is a ConfigError naming it."""
    parts = []
    for name in text_files(path):
        try:
            with open(name, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"data {name!r} is not UTF-8 text: {exc.reason} at byte "
                              f"{exc.start}") from None
        except OSError as exc:
            raise ConfigError(f"data {name!r}: {exc.strerror}") from None
        if parts and not parts[-1].endswith("\n"):
            parts.append("\n")
        parts.append(text)
    text = "".join(parts)
    if not text:
        raise ConfigError(f"data {path!r} is empty")
    return text


def open_token_stream(path: str, vocab_size: int) -> np.ndarray:
    """An ``.npy`` 1-D integer array of token ids, memory-mapped (read, never loaded
    whole); every id must be in [0, vocab_size)."""
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data {path!r} is not a readable .npy token stream: {exc}") \
            from None
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ConfigError(f"data {path!r}: a token stream is a 1-D integer array, got "
                          f"{tokens.dtype.name}{list(tokens.shape)}")
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ConfigError(f"data {path!r}: token ids must be in [0, {vocab_size}) (the "
                          f"model's vocab_size); they span [{int(tokens.min())}, "
                          f"{int(tokens.max())}]")
    return tokens


def read_stream(path: str, vocab_size: int) -> str | np.ndarray:
    """The text of a UTF-8 file or folder, or the memory-mapped ids of an ``.npy``."""
    return open_token_stream(path, vocab_size) if path.endswith(".npy") else read_text(path)


def make_tokenizer(kind: str, streams: list, vocab_size: int) -> Tokenizer:
    """The tokenizer of a job's streams: ``ids`` for ``.npy`` ones, else ``kind`` (``char``
    built from all the texts, so the validation text reads with the training vocabulary);
    one larger than the model's vocabulary is a ConfigError."""
    texts = [s for s in streams if isinstance(s, str)]
    if not texts:
        return Tokenizer("ids")
    if len(texts) != len(streams):
        raise ConfigError("data and eval_data must both be text or both .npy token streams")
    tok = char_tokenizer("".join(texts)) if kind == "char" else Tokenizer("byte")
    check_fits(tok, vocab_size)
    return tok


def check_fits(tok: Tokenizer, vocab_size: int) -> None:
    if tok.vocab_size is not None and tok.vocab_size > vocab_size:
        raise ConfigError(f"the {tok.kind} tokenizer's vocabulary has {tok.vocab_size} "
                          f"tokens, more than the model's vocab_size {vocab_size}: raise "
                          f"model_args.vocab_size (or use tokenizer 'char')")


def tokens_of(stream: str | np.ndarray, tok: Tokenizer) -> np.ndarray:
    return tok.encode(stream) if isinstance(stream, str) else stream
