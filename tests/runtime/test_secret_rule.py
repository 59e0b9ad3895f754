"""The one secret rule (ringflow.secrets), as the runtime applies it on hosts without
Airflow: which variable names hold secrets (a table, both ways), which passwords a URL
value holds, and what of a value is hidden."""

from __future__ import annotations

import pytest

from ringflow.secrets import hidden_parts, is_secret_name, name_words, url_passwords

SECRET_NAMES = [
    "DB_PASS", "DB_PASS2", "SMTP_PASS", "DB_PASSWORD", "dbPassword", "SMTP_PASSWD",
    "MYSQL_PWD", "AWS_CREDENTIALS", "GOOGLE_APPLICATION_CREDENTIALS", "DOCKER_CREDS",
    "GITHUB_PAT", "GH_PAT", "SENTRY_DSN", "DB_DSN", "SSH_PRIVATE_KEY", "PRIVATE_KEY_PEM",
    "privateKeyFile", "API_KEY", "apiKey", "APIKEY", "KEY", "KEYS", "SSH_KEY",
    "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "RINGFLOW_JOB_TOKEN", "MYSECRET", "client_secret",
    "GPG_PASSPHRASE", "HTTP_AUTHORIZATION", "BASIC_AUTH", "PASS_THROUGH",
    "TOKENIZER_NAME",  # the token substring rule errs on the side of hiding, as Airflow's
]
PLAIN_NAMES = [
    "PWD", "OLDPWD", "PASSTHROUGH", "BYPASS_CACHE", "COMPASS_HEADING", "PASSENGER_COUNT",
    "KEYBOARD_LAYOUT", "MONKEY", "TURNKEY", "KEYNOTE", "keyring", "PATH", "PYTHONPATH",
    "PATTERN", "HOME", "AUTHOR", "DATABASE_URL", "OMP_NUM_THREADS", "PADDLE_TRAINER_ID",
    "RINGFLOW_JOB_ID", "LR",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_looking_name_is_secret(name):
    assert is_secret_name(name) is True


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_a_name_whose_words_say_nothing_secret_is_not(name):
    assert is_secret_name(name) is False


@pytest.mark.parametrize("name, words", [
    ("SSH_PRIVATE_KEY", ["ssh", "private", "key"]), ("apiKey2", ["api", "key"]),
    ("db-pass.v2", ["db", "pass", "v"]), ("KEYBOARD_LAYOUT", ["keyboard", "layout"]),
    ("__X__", ["x"]), ("", [])])
def test_names_split_into_lower_case_words_without_trailing_digits(name, words):
    assert name_words(name) == words


@pytest.mark.parametrize("value, passwords", [
    ("postgres://app:s3cretpw@db:5432/prod", ["s3cretpw"]),
    ("redis://:hunter22@cache:6379/0", ["hunter22"]),
    ("amqp://u:p%40ss%3Aw0rd@mq/", ["p%40ss%3Aw0rd", "p@ss:w0rd"]),
    ("a=postgres://a:pw111@h,mysql://b:pw222@h2", ["pw111", "pw222"]),
    ("https://user@host/x", []),
    ("http://host:8080/path@x", []),
    ("user:password@host", []),  # no scheme: not a URL
    ("just text", []),
    ("", []),
])
def test_the_passwords_of_urls_in_a_value(value, passwords):
    assert url_passwords(value) == passwords


def test_under_a_secret_name_the_whole_value_and_its_url_password_are_hidden():
    url = "postgres://app:s3cretpw@db:5432/prod"
    assert hidden_parts("DB_DSN", url) == [url, "s3cretpw"]
    assert hidden_parts("DB_PASS", "hunter2xx") == ["hunter2xx"]
    assert hidden_parts(None, "given-as-secret") == ["given-as-secret"]  # secret_env


def test_under_a_plain_name_only_a_url_password_is_hidden():
    assert hidden_parts("DATABASE_URL", "postgres://app:s3cretpw@db/prod") == ["s3cretpw"]
    assert hidden_parts("RUN_NAME", "visible") == []
