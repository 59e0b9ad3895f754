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

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

#: 10,000 generated inputs per entry point, the same ones on every run (CI is reproducible)
#: and no .hypothesis folder; the suite's autouse fixtures (fresh default programs) do not
#: touch what these tests check, so their function scope is harmless here
PROPERTY_SETTINGS = settings(max_examples=int(__import__("os").environ.get("PROPS_N", 10_000)), deadline=None, derandomize=True,
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


@functools.cache
def hostile_text(max_pieces: int = 6) -> st.SearchStrategy[str]:
    """A string built of hostile pieces and ordinary characters, sometimes very long."""
    piece = st.one_of(st.sampled_from(PIECES),
                      st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]),
                              max_size=4))
    short = st.lists(piece, min_size=1, max_size=max_pieces).map("".join)
    long = st.builds(lambda p, n: p * n, st.sampled_from(["a", "-x A=1 ", "é", "$(id)"]),
                     st.integers(300, 3000))
    return st.one_of(short, short, short, long)


@functools.cache
def text_or(*valid: str, max_pieces: int = 6) -> st.SearchStrategy[str]:
    """Mostly one of the `valid` strings, else a hostile one (also a valid one with hostile
    pieces around it)."""
    good = st.sampled_from(list(valid))
    around = st.tuples(hostile_text(2), good, hostile_text(2)).map("".join)
    return st.one_of(good, good, hostile_text(max_pieces), around,
                     st.tuples(good, st.sampled_from(PIECES)).map("".join))


@functools.cache
def env_name() -> st.SearchStrategy[str]:
    """Variable names: valid ones, reserved ones, secret-looking ones and hostile ones."""
    valid = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,12}\Z")
    known = st.sampled_from(["FOO", "A", "_X", "DB_PASSWORD", "API_TOKEN", "PATH",
                             "LD_PRELOAD", "PYTHONPATH", "PADDLE_TRAINER_ID", "RINGFLOW_JOB_ID",
                             "POPART_LOG_LEVEL", "OMP_NUM_THREADS", "BASH_ENV"])
    return st.one_of(valid, known, known, hostile_text(3),
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
                       st.floats(allow_nan=True, allow_infinity=True), hostile_text(3))
    return st.recursive(scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text(2), inner, max_size=3)),
        max_leaves=6)


# -- the shell text a launcher sends -------------------------------------------------------------

OPERATORS = ("&&", "||", ";;", ">>", ">&", "<&", ";", "&", "|", "<", ">", "(", ")", "\n")
ACTIVE = "\0"  # marks a character the shell expands (NUL itself cannot be in a command)


def shell_words(script: str) -> list[str]:
    """The words and operators of POSIX sh text, quotes removed; every character the shell
    would expand or glob (`$`, a backquote, `*`, `?`, `[`, a leading `~`) outside single
    quotes is preceded by ACTIVE, so two texts split alike run alike. Comments are dropped.
    An unterminated quote is a ValueError."""
    words: list[str] = []
    word: list[str] | None = None
    i, n = 0, len(script)

    def end() -> None:
        nonlocal word
        if word is not None:
            words.append("".join(word))
            word = None

    while i < n:
        c = script[i]
        if c in " \t":
            end()
            i += 1
            continue
        op = next((o for o in OPERATORS if script.startswith(o, i)), None)
        if op is not None:
            end()
            words.append(op)
            i += len(op)
            continue
        if c == "#" and word is None:
            while i < n and script[i] != "\n":
                i += 1
            continue
        if word is None:
            word = []
            if c == "~":
                word.append(ACTIVE)
        if c == "'":
            close = script.find("'", i + 1)
            if close < 0:
                raise ValueError("unterminated single quote")
            word.append(script[i + 1:close])
            i = close + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    raise ValueError("unterminated double quote")
                d = script[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\" and i + 1 < n and script[i + 1] in '$`"\\\n':
                    word.append(script[i + 1] if script[i + 1] != "\n" else "")
                    i += 2
                    continue
                word.append(ACTIVE + d if d in "$`" else d)
                i += 1
        elif c == "\\":
            if i + 1 < n and script[i + 1] != "\n":
                word.append(script[i + 1])
            i += 2
        else:
            word.append(ACTIVE + c if c in "$`*?[" else c)
            i += 1
    end()
    return words


def remote_script(command: str) -> str:
    """The script of a command `sh -c SCRIPT` as the remote shell gets it (one word)."""
    words = shell_words(command)
    assert words[:2] == ["sh", "-c"] and len(words) == 3, words[:4]
    assert ACTIVE not in words[2], "the remote shell would expand part of the script"
    return words[2]


def same_shape(script: str, skeleton: str, values: dict[str, str]) -> list[str]:
    """Check that `script` is `skeleton` with each placeholder (a key of `values`) replaced
    by its value inside one word: the same words, operators and expansions, in the same
    order. Returns the script's words; AssertionError naming the first difference."""
    assert ACTIVE not in script, "a NUL in the shell text"
    got, want = shell_words(script), shell_words(skeleton)
    placed = []
    for word in want:
        for key, value in values.items():
            word = word.replace(key, value)
        placed.append(word)
    for index, (a, b) in enumerate(zip(got, placed)):
        assert a == b, f"word {index}: {a!r} where the skeleton has {b!r}"
    assert len(got) == len(placed), (
        f"{len(got)} words where the skeleton has {len(placed)}: "
        f"{got[len(placed):] or placed[len(got):]!r}")
    return got
