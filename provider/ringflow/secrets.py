"""Which variables hold secrets, and which parts of a value to hide: the one rule, here in the
runtime because the supervisor on a host without Airflow applies it to what it masks (the
provider's `ringflow_provider.jobs.masking` adds only Airflow's configured names to it).

A variable's NAME says its value is secret when, split into words (at every character that
is not a letter or digit, and where camelCase turns upper; lower case, trailing digits off:
``DB_PASS2`` -> db, pass; ``apiKey`` -> api, key):

- a word is one of WORDS: ``key``/``keys`` (API_KEY, SSH_KEY, KEY), ``pass``
  (DB_PASS), ``pwd`` (MYSQL_PWD), ``pat`` (GITHUB_PAT, a personal access token), ``dsn``
  (SENTRY_DSN), ``auth``, ``creds``; or
- the words run together contain one of PARTS: secret, password, passwd, token, credential,
  privatekey, apikey, accesskey, passphrase, authorization (MYSECRET, DBPASSWORD,
  GOOGLE_APPLICATION_CREDENTIALS, SSH_PRIVATE_KEY, HF_TOKEN; also TOKENIZER_NAME: a
  substring rule, as Airflow's masker has, errs on the side of hiding).

So ``key`` and ``pass`` count as whole words only: KEYBOARD_LAYOUT, MONKEY, TURNKEY,
PASSTHROUGH, BYPASS, PATH and PATTERN are not secret (PASS_THROUGH is: its words say pass).
The shell's own PWD and OLDPWD (the working folder) are not secret either.

A VALUE that holds a URL with a password (``scheme://user:password@host/...``) has that
password hidden wherever it shows, whatever the variable's name, the rest of the URL left
readable (``postgres://app:***@db:5432/prod``); the variable travels as a secret does. Under
a secret name the whole value is hidden as well. Values shorter than MIN_MASKED_LEN are not
replaced wherever they occur (``1`` would turn every 1 into ***), as Airflow's masker does.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MIN_MASKED_LEN = 5
WORDS = frozenset({"key", "keys", "pass", "pwd", "pat", "dsn", "auth", "creds"})
PARTS = ("secret", "password", "passwd", "token", "credential", "privatekey", "apikey",
         "accesskey", "passphrase", "authorization")
NOT_SECRET = frozenset({"PWD", "OLDPWD"})  # the shell's working folders
_CHUNK = re.compile(r"[^A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:([^\s/@]+)@")


def name_words(name: str) -> list[str]:
    """``SSH_PRIVATE_KEY`` -> ssh, private, key; ``apiKey2`` -> api, key."""
    words = []
    for chunk in _CHUNK.split(str(name)):
        words += [w.lower().rstrip("0123456789") for w in _CAMEL.split(chunk)]
    return [w for w in words if w]


def is_secret_name(name: str) -> bool:
    """Whether a variable called `name` holds a secret (the module docstring's rule)."""
    if str(name) in NOT_SECRET:
        return False
    words = name_words(name)
    joined = "".join(words)
    return any(w in WORDS for w in words) or any(part in joined for part in PARTS)


def url_passwords(value: str) -> list[str]:
    """The passwords of the URLs in `value` (as written, and percent-decoded if different)."""
    found: list[str] = []
    for match in _URL_PASSWORD.finditer(str(value)):
        for form in (match.group(1), unquote(match.group(1))):
            if form not in found:
                found.append(form)
    return found


def hidden_parts(name: str | None, value: str) -> list[str]:
    """What of variable `name`'s value is secret: all of it under a secret name (or with no
    name: a value given as secret), else only the passwords of its URLs (maybe none)."""
    passwords = url_passwords(value)
    if name is not None and not is_secret_name(name):
        return passwords
    return [str(value), *passwords] if value else passwords
