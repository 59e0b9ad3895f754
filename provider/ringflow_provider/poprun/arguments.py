"""PopRunOperator's arguments as a `PopRunConfig`, without Airflow: the cheap parse-time check
of the literal (non-templated) ones, the rendered ones' validation, the secret values among
them. Errors are `ValueError` or `ConfigError`; the operator turns them into its exception."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ringflow.errors import ConfigError
from ringflow_provider.jobs.masking import Secrets
from ringflow_provider.poprun.compose import (
    FIELD_NAMES,
    PopRunConfig,
    config_error_message,
    parse_config,
    validate_field,
)
from ringflow_provider.poprun.models import ALLOW_FIELDS, check_host

__all__ = ["check_literals", "exit_codes", "given_secrets", "is_templated", "parse_arguments",
           "to_bool"]

_BOOL = TypeAdapter(bool)


def is_templated(value: Any) -> bool:
    """A Jinja template anywhere in the value (a string, or one inside a list or dict)."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, (list, tuple)):
        return any(is_templated(v) for v in value)
    if isinstance(value, dict):
        return any(is_templated(k) or is_templated(v) for k, v in value.items())
    return False


def check_literals(values: dict[str, Any], launch_host: str | None) -> None:
    """Parse-time check of the operator's arguments (`values`: PopRunConfig's fields and the
    allow_unsafe_* switches) that are not templated; no I/O."""
    for name in ALLOW_FIELDS:  # literal only: a template must not switch them on
        if not isinstance(values[name], bool):
            raise ValueError(f"{name}: expected True or False (not templated), got "
                             f"{values[name]!r}")
    fields = {name: values[name] for name in FIELD_NAMES}
    if not any(is_templated(v) for v in fields.values()):
        parse_config(values)
    else:
        for name, value in fields.items():
            if not is_templated(value):
                try:
                    validate_field(name, value)
                except ValidationError as exc:  # names no field by itself
                    raise ConfigError(config_error_message(exc, name)) from None
    if launch_host and not is_templated(launch_host):
        _check_launch_host(launch_host)


def parse_arguments(values: dict[str, Any], launch_host: str | None) -> PopRunConfig:
    """The rendered arguments, validated."""
    config = parse_config(values)
    if launch_host:
        _check_launch_host(launch_host)
    return config


def _check_launch_host(launch_host: str) -> None:
    try:
        check_host(launch_host.strip())
    except ValueError as exc:
        raise ValueError(f"launch_host: {exc}") from None


def to_bool(name: str, value: bool | str) -> bool:
    """A templated yes/no argument as a bool (ValueError naming it)."""
    try:
        return _BOOL.validate_python(value)
    except ValueError:
        raise ValueError(f"{name}: expected a boolean, got {value!r}") from None


def given_secrets(extra_env: Any, secret_env: Any) -> Secrets:
    """The secret values among the arguments as they stand (maybe not valid yet)."""
    return Secrets().add_env(extra_env).add_env(secret_env, all_secret=True)


def exit_codes(codes: int | Container[int] | None) -> frozenset[int]:
    """skip_on_exit_code as a set: None, one code or several."""
    if codes is None:
        return frozenset()
    if isinstance(codes, int):
        return frozenset({codes})
    return frozenset(codes)  # type: ignore[arg-type]
