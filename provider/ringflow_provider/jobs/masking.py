"""Which values are secret and how they are hidden: the one rule every operator uses.

The rule itself is the runtime's (`ringflow.secrets`, read its docstring), so the supervisor
on a host without Airflow applies the same one: a variable's name is secret when one of its
words is key, pass, pwd, pat, dsn, auth or creds, or its letters hold secret, password,
passwd, token, credential, privatekey, apikey, accesskey, passphrase or authorization
(not KEYBOARD_LAYOUT, MONKEY, PASSTHROUGH, PWD); a URL's password (``user:password@``) is
hidden in any value, the rest of the URL left readable. Here it gains only what Airflow's
masker is configured to deem sensitive (asked through `airflow.sdk.log.redact`: its
defaults and ``[core] sensitive_var_conn_names``). A value is also secret when it is given as one (a
`secret_env` value, a connection password). Importing this module imports nothing from
Airflow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ringflow.secrets import MIN_MASKED_LEN, hidden_parts, url_passwords
from ringflow.secrets import is_secret_name as _runtime_rule

MASK = "***"
__all__ = ["MASK", "MIN_MASKED_LEN", "Secrets", "is_secret_name", "mask_text",
           "secret_env_values", "split_env", "url_passwords"]


def is_secret_name(name: str) -> bool:
    """Whether a variable called `name` holds a secret."""
    return _runtime_rule(name) or _airflow_hides(name)


def is_hidden(name: str, value: Any) -> bool:
    """Whether variable `name` must travel as a secret (never on a command line)."""
    return is_secret_name(name) or bool(url_passwords(str(value)))


def _airflow_hides(name: str) -> bool:
    """Whether Airflow's masker, as configured (`[core] sensitive_var_conn_names` too), hides
    a value under `name`. Asked through its public `redact`, which replaces the whole value of
    a sensitive name; the probe is compared with itself redacted without a name, so a
    registered secret inside the probe cannot pass for a sensitive name."""
    try:
        from airflow.sdk.log import redact
    except ImportError:  # outside Airflow (the rule above still holds)
        return False
    probe = "ringflow-name-probe"
    try:
        return redact(probe, str(name)) != redact(probe)
    except Exception:  # a masker without its configuration: our own rule decides
        return False


def secret_env_values(env: Any) -> list[str]:
    """Secret values of an env mapping that may not be valid yet (a dict or its JSON text),
    so they can be masked before validation, whose messages quote values."""
    if isinstance(env, str):
        try:
            env = json.loads(env)
        except json.JSONDecodeError:
            return []
    if not isinstance(env, Mapping):
        return []
    values = {part for name, value in env.items() if value
              for part in _parts(str(name), str(value))}
    return sorted(values, key=len, reverse=True)


def _parts(name: str, value: str) -> list[str]:
    """What of `name`'s value to hide: the runtime's rule, with Airflow's names."""
    return hidden_parts(None if is_secret_name(name) else name, value)


def split_env(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, hidden): the variables of `env` whose values may sit on a command line, and
    those under secret names or holding a URL's password, which travel as secrets do
    (stdin, never a command line)."""
    plain = {name: value for name, value in env.items() if not is_hidden(name, value)}
    hidden = {name: value for name, value in env.items() if name not in plain}
    return plain, hidden


def mask_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret of at least MIN_MASKED_LEN characters replaced by ***."""
    for secret in secrets:
        if secret and len(secret) >= MIN_MASKED_LEN:
            text = text.replace(secret, MASK)
    return text


def _forms(value: str) -> set[str]:
    """The value as printed, inside JSON text and inside a repr (escapes differ)."""
    return {value, json.dumps(value)[1:-1], repr(value)[1:-1]}


class Secrets:
    """The secret values of one task: collected, registered with Airflow's masker, masked.

    Plain data (a set of strings), so Airflow can deep-copy an operator that holds one; its
    repr shows how many values it holds, never one of them.
    """

    def __init__(self, values: Iterable[str | None] = ()) -> None:
        self._values: set[str] = set()
        self._forms: list[str] = []  # what mask() replaces, longest first
        self.add(*values)

    def add(self, *values: str | None) -> Secrets:
        """Explicit secrets (a password, a `secret_env` value), each with the passwords of
        the URLs it holds; empty ones are ignored."""
        self._values.update(part for v in values if v for part in hidden_parts(None, str(v)))
        forms = {form for value in self._values if len(value) >= MIN_MASKED_LEN
                 for form in _forms(value)}
        self._forms = sorted(forms, key=len, reverse=True)
        return self

    def add_env(self, env: Any, *, all_secret: bool = False) -> Secrets:
        """The values of an env mapping (or its JSON text) under secret names; every value
        when `all_secret` (a `secret_env` argument)."""
        if all_secret:
            if isinstance(env, str):
                try:
                    env = json.loads(env)
                except json.JSONDecodeError:
                    return self
            if isinstance(env, Mapping):
                self.add(*(str(v) for v in env.values()))
            return self
        return self.add(*secret_env_values(env))

    @property
    def values(self) -> list[str]:
        """Longest first, so a secret that contains another is masked whole."""
        return sorted(self._values, key=len, reverse=True)

    def register(self) -> None:
        """Give every value to Airflow's masker, which then redacts the task log, rendered
        fields and XCom (and tells the supervisor, when running in a task)."""
        from airflow.sdk.log import mask_secret

        for value in self.values:
            mask_secret(value)

    def mask(self, text: str) -> str:
        """`text` with each secret replaced by ***, also in its JSON- and repr-escaped forms;
        values shorter than MIN_MASKED_LEN are left alone, as Airflow's masker does."""
        for form in self._forms:
            text = text.replace(form, MASK)
        return text

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Secrets(<{len(self._values)} hidden>)"
