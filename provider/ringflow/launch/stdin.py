"""The launcher's `--stdin` protocol: secrets arrive as the first line on stdin, and the end of
stdin afterwards means whoever started the launcher (an Airflow task) is gone.

The first line is one JSON object of environment variables (`{"RINGFLOW_JOB_TOKEN": "..."}`,
possibly `{}`), read with a deadline. Its values are secrets: no message here ever contains
one, and a key that is not a variable name is not quoted either (it may be a misplaced
value). After it, `StdinWatch` keeps reading until EOF or a read error.
"""

from __future__ import annotations

import json
import os
import re
import select
import threading
import time
from collections.abc import Mapping

from ringflow.errors import ConfigError
from ringflow.secrets import hidden_parts, is_secret_name, url_passwords

STDIN_FD = 0
DEFAULT_TIMEOUT_S = 30.0
MAX_LINE_BYTES = 1 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_EXPECTED = 'one line of JSON object text, e.g. {"RINGFLOW_JOB_TOKEN": "..."} or {}'


def encode_secrets(values: Mapping[str, str]) -> bytes:
    """The first line a launcher started with --stdin expects (what the provider writes)."""
    return json.dumps(dict(values), separators=(",", ":")).encode() + b"\n"


def read_secrets(fd: int = STDIN_FD, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """Read and parse the first line of `fd` within `timeout_s`; raises ConfigError.

    Bytes after the line are dropped: from then on only the end of the input matters.
    """
    return parse_secrets(read_line(fd, timeout_s))


def read_line(fd: int = STDIN_FD, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """The first line of `fd` (without its newline) within `timeout_s`; ConfigError."""
    deadline = time.monotonic() + timeout_s
    data = bytearray()
    while b"\n" not in data:
        if len(data) > MAX_LINE_BYTES:
            raise ConfigError(f"--stdin: the first line is longer than {MAX_LINE_BYTES} bytes; "
                              f"expected {_EXPECTED}")
        left = deadline - time.monotonic()
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            chunk = os.read(fd, 65536) if ready else None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--stdin: cannot read stdin: {exc}") from None
        if chunk is None:
            got = f"{len(data)} bytes without a newline" if data else "nothing"
            raise ConfigError(f"--stdin: no secrets line on stdin within {timeout_s:g} s "
                              f"(got {got}); expected {_EXPECTED}")
        if not chunk:
            got = f"after {len(data)} bytes without a newline" if data else "before any input"
            raise ConfigError(f"--stdin: stdin ended {got}; expected {_EXPECTED}")
        data += chunk
    return bytes(data[:data.index(b"\n")])


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def parse_secrets(line: bytes) -> dict[str, str]:
    """The variables of one secrets line; errors name keys and types, never values."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--stdin: the secrets line is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:  # exc.msg never quotes the document
        raise ConfigError(f"--stdin: the secrets line is not valid JSON at character "
                          f"{exc.pos} ({exc.msg}); expected {_EXPECTED}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--stdin: the secrets line is a JSON {_json_type(value)}; "
                          f"expected {_EXPECTED}")
    for index, (name, item) in enumerate(value.items(), start=1):
        if not _ENV_NAME.match(name):
            raise ConfigError(f"--stdin: key {index} of {len(value)} in the secrets line is not "
                              "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if not isinstance(item, str):
            raise ConfigError(f"--stdin: {name} in the secrets line is a JSON "
                              f"{_json_type(item)}; expected a string")
        if "\0" in item:
            raise ConfigError(f"--stdin: the value of {name} holds a NUL character, which an "
                              "environment variable cannot carry")
    return value


class StdinWatch(threading.Thread):
    """Reads `fd` until it ends; `ended` is set then, with `reason` saying how.

    Started only after the workers are spawned: the launcher forks with a preexec_fn, which
    is unsafe once other threads exist.
    """

    def __init__(self, fd: int = STDIN_FD) -> None:
        super().__init__(name="ringflow-stdin-watch", daemon=True)
        self._fd = fd
        self.ended = threading.Event()
        self.reason = ""

    def run(self) -> None:
        try:
            while True:
                try:
                    if not os.read(self._fd, 65536):
                        break  # anything before the end is ignored
                except BlockingIOError:  # someone made the file description non-blocking
                    select.select([self._fd], [], [])
            self.reason = "stdin closed"
        except OSError as exc:
            self.reason = f"reading stdin failed ({exc.strerror or exc})"
        self.ended.set()


ENV_KEY, MASK_KEY = "ringflow:env", "ringflow:mask"


def read_envelope() -> tuple[dict[str, str], list[str]]:
    """The first stdin line: the secret variables, and more values to mask in the output
    (a connection's password the job might print), as ``{"ringflow:env": {...},
    "ringflow:mask": [...]}``; a plain object of variables is the variables alone."""
    line = read_line()
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if isinstance(value, dict) and set(value) <= {ENV_KEY, MASK_KEY} and value:
        masks = value.get(MASK_KEY) or []
        if not isinstance(masks, list) or not all(isinstance(m, str) for m in masks):
            raise ConfigError(f"--secrets: {MASK_KEY} must be a list of strings")
        return parse_secrets(json.dumps(value.get(ENV_KEY) or {}).encode()), masks
    return parse_secrets(line), []


def envelope_parts(name: str, value: str) -> list[str]:
    """What of a secret variable's value output.log hides: all of it, and its URLs'
    passwords; only those when it is a URL under a name that is not secret (`ringflow.secrets`:
    the rest of the URL stays readable)."""
    passwords = url_passwords(value)
    if passwords and not is_secret_name(name):
        return passwords
    return hidden_parts(None, value)
