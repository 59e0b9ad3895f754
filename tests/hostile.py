"""Hostile values for the property tests of the entry points (hypothesis strategies), and the
word splitter of the POSIX shell text that the launchers send to a host.

The strategies mix what breaks a command line (shell metacharacters, quotes, newlines, `\\r`,
NULs, leading dashes, `=`, `--flag` lookalikes, `-x NAME=VALUE`, JSON inside a string,
unicode, very long strings, `{}` format fields) with values that look valid, so a property
sees both the values an entry point takes and those it refuses.
"""

from __future__ import annotations

import functools
import json
import os
import re

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

#: 1,000 generated inputs per entry point in `make test` (the same ones on every run: CI is
#: reproducible); PROPS_N=10000 for the full depth. At 10,000 the six property tests take
#: 12 min of the suite on the 2-core machine (measured 2026-12-03: 718 s of 1,721 s), which
#: would put `make test` past its 20-minute budget; run them at 10,000 before a release or
#: after changing an entry point's rules (they passed at 10,000 on 2026-12-03)
#: and no .hypothesis folder; the suite's autouse fixtures (fresh default programs) do not
#: touch what these tests check, so their function scope is harmless here
PROPERTY_SETTINGS = settings(max_examples=int(os.environ.get("PROPS_N", 1_000)),
                             deadline=None, derandomize=True,
                             database=None, print_blob=False,
                             # no explain phase: it traces every line (slow before 3.12)
                             phases=[Phase.explicit, Phase.generate, Phase.shrink],
                             suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                    HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])

# The pieces of a hostile string: each breaks a command line in its own way.
PIECES = [
    ";", "&", "&&", "|", "||", "$(id)", "`id`", "$HOME", "${IFS}", ">", "<", ">/tmp/x", "2>&1",
    "'", '"', "\\", "\n", "\r", "\r\n", "\0", "\t", " ", "*", "?", "[a]", "~", "#", "!",
    "-", "--", "-x", "-x EVIL=1", "--mca", "--host=evil", "--num-instances=9", "=", "==",
    "A=B", "EVIL=1", ",", ":", "/", "..", "./", "{", "}", "{}", "{0}", "{dag_id}", "{x.y}",
    "{{ params.x }}", '{"a": 1}', "[1, 2]", "null", "true", "1e309", "NaN", "-1", "0",
    "é", "ü", "\u202e", "\u00a0", "\u2028", "\U0001f600", "\x1b[31m", "\x7f",
    "python3", "train.py", "localhost", "10.0.0.1", "node-1", "pod16", "TOKEN", "PASSWORD",
    "http://user:pw@host/x",
]


ALPHABET = "aZ09_-=./:,@+ é\n\r\0\t\"'$;|&`\\*{}"


@functools.cache
def hostile_text() -> st.SearchStrategy[str]:
    """A string of hostile pieces and single characters, sometimes very long."""
    piece = st.one_of(st.sampled_from(PIECES), st.text(alphabet=ALPHABET, max_size=3))
    short = st.lists(piece, min_size=1, max_size=5).map("".join)
    long = st.builds(lambda p, n: p * n, st.sampled_from(["a", "-x A=1 ", "é", "$(id)"]),
                     st.integers(300, 3000))
    return st.one_of(short, short, short, long)


@functools.cache
def text_or(*valid: str) -> st.SearchStrategy[str]:
    """One of the `valid` strings, a hostile one, or a valid one with a hostile piece
    before or after it."""
    good = st.sampled_from(valid)
    piece = st.sampled_from(PIECES)
    return st.one_of(good, hostile_text(), st.tuples(good, piece).map("".join),
                     st.tuples(piece, good).map("".join))


@st.composite
def mostly_valid(draw, valid: dict, hostile: dict, most: int = 2) -> dict:
    """Every argument of `valid` (name -> strategy) drawn valid, then up to `most` of those
    in `hostile` (name -> strategy) drawn from it instead: most inputs are then valid but
    for one or two values, so both what is taken and what is refused get tested."""
    values = {name: draw(strategy) for name, strategy in valid.items()}
    names = draw(st.lists(st.sampled_from(sorted(hostile)), max_size=most, unique=True))
    for name in names:
        values[name] = draw(hostile[name])
    return {k: v for k, v in values.items() if v is not OMIT}


#: a `valid` strategy's value that leaves the argument out (its default)
OMIT = object()


@functools.cache
def env_name() -> st.SearchStrategy[str]:
    """Variable names: valid ones, reserved ones, secret-looking ones and hostile ones."""
    valid = st.tuples(st.sampled_from("ABCXYZ_"), st.text("ABZ019_", max_size=8)).map("".join)
    known = st.sampled_from(["FOO", "A", "_X", "DB_PASSWORD", "API_TOKEN", "PATH",
                             "LD_PRELOAD", "PYTHONPATH", "PADDLE_TRAINER_ID", "RINGFLOW_JOB_ID",
                             "POPART_LOG_LEVEL", "OMP_NUM_THREADS", "BASH_ENV"])
    return st.one_of(valid, known, known, hostile_text(),
                     st.tuples(known, st.sampled_from(["\n", "=", " ", "-", ";", "é"]))
                     .map("".join))


@functools.cache
def env_value() -> st.SearchStrategy[str]:
    return text_or("1", "x", "info", "/opt/data", "a,b", "user@host", "k=v",
                   "http://u:secretpw@db/x")


@functools.cache
def env_map() -> st.SearchStrategy[dict]:
    return st.dictionaries(env_name(), env_value(), max_size=4)


@functools.cache
def as_json_text(values: st.SearchStrategy) -> st.SearchStrategy:
    """The value itself, or the JSON text a template renders it to."""
    return st.one_of(values, values.map(json.dumps))


@functools.cache
def anything() -> st.SearchStrategy:
    """A value of any JSON type (and a few that JSON has not), for fields that take one."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                       st.floats(allow_nan=True, allow_infinity=True), hostile_text())
    return st.recursive(scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text(), inner, max_size=3)),
        max_leaves=6)


# -- the shell text a launcher sends -------------------------------------------------------------

ACTIVE = "\0"  # marks a character the shell expands (NUL itself cannot be in a command)
_PIECE = re.compile(r"""
    (?P<blank>[ \t]+)
  | (?P<op>&&|\|\||;;|>>|>&|<&|[;&|<>()\n])
  | (?P<single>'[^']*')
  | (?P<double>"(?:[^"\\]|\\.)*")
  | (?P<escaped>\\.)
  | (?P<comment>\#[^\n]*)
  | (?P<plain>[^ \t;&|<>()\n'"\\]+)
""", re.X | re.S)
_DOUBLE_ESCAPE = re.compile(r'\\([$`"\\\n])|([$`])')
_PLAIN_ACTIVE = re.compile(r"([$`*?\[])")


def shell_words(script: str) -> list[str]:
    """The words and operators of POSIX sh text, quotes removed; every character the shell
    would expand or glob (`$`, a backquote, `*`, `?`, `[`, a leading `~`) outside single
    quotes is preceded by ACTIVE, so two texts split alike run alike. Comments are dropped.
    An unterminated quote is a ValueError."""
    words: list[str] = []
    word: list[str] | None = None
    at = 0
    while at < len(script):
        match = _PIECE.match(script, at)
        if match is None:
            raise ValueError(f"unterminated quote or escape at {at}: {script[at:at + 20]!r}")
        kind, text = match.lastgroup, match.group()
        at = match.end()
        if kind in ("blank", "op") or (kind == "comment" and word is None):
            if word is not None:
                words.append("".join(word))
                word = None
            if kind == "op":
                words.append(text)
            continue
        if word is None:
            word = [ACTIVE] if text.startswith("~") and kind == "plain" else []
        if kind == "single":
            word.append(text[1:-1])
        elif kind == "double":
            word.append(_DOUBLE_ESCAPE.sub(
                lambda m: ("" if m.group(1) == "\n" else m.group(1)) if m.group(1)
                else ACTIVE + m.group(2), text[1:-1]))
        elif kind == "escaped":
            word.append("" if text[1] == "\n" else text[1])
        else:  # plain, or a `#` inside a word
            word.append(_PLAIN_ACTIVE.sub(ACTIVE + r"\1", text))
    if word is not None:
        words.append("".join(word))
    return words


def remote_words(command: str) -> list[str]:
    """The words of the script of a command `sh -c SCRIPT`, as the remote shell runs it."""
    assert "\0" not in command, "a NUL in the shell text"
    words = shell_words(command)
    assert words[:2] == ["sh", "-c"] and len(words) == 3, words[:4]
    assert ACTIVE not in words[2], "the remote shell would expand part of the script"
    return shell_words(words[2])


def same_shape(got: list[str], want: list[str], values: dict[str, str],
               not_options: tuple[str, ...] = ()) -> None:
    """Check that the words `got` are the skeleton's words `want` with each placeholder (a
    key of `values`) replaced by its value inside one word: the same words, operators and
    expansions, in the same order; a word the skeleton starts with a placeholder of
    `not_options` must not start with '-' (a command would read it as an option).
    AssertionError naming the first difference."""
    placed = []
    for word in want:
        for key, value in values.items():
            if key in word:
                if key in not_options and word.startswith(key):
                    assert not value.startswith("-"), f"{value!r} would be read as an option"
                word = word.replace(key, value)
        placed.append(word)
    for index, (a, b) in enumerate(zip(got, placed)):
        assert a == b, f"word {index}: {a!r} where the skeleton has {b!r}"
    assert len(got) == len(placed), (
        f"{len(got)} words where the skeleton has {len(placed)}: "
        f"{got[len(placed):] or placed[len(got):]!r}")
