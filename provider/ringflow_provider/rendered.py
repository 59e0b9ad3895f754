"""Values as templates render them: lists and dicts arrive as JSON (or Python literal) text,
None as '' or 'None', true or false as text. Every operator argument that takes a list, a
dict or None reads its rendered value through these; a templated switch through `flag`."""

from __future__ import annotations

import ast
import json
from typing import Any

from pydantic import TypeAdapter

_BOOL = TypeAdapter(bool)


def json_text(value: Any, what: str = "value") -> Any:
    """A template renders lists and dicts to text: accept their JSON form, and Python's
    literal form (what ``{{ params.x }}`` of a dict or list param renders to)."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            try:
                literal = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                raise ValueError(f"{what}: expected JSON text, got {value!r} ({exc.msg})") \
                    from None
            if isinstance(literal, (list, dict)):
                return literal
            raise ValueError(f"{what}: expected JSON text, got {value!r}") from None
    return value


def none_text(value: Any) -> Any:
    """An optional field rendered from a None param arrives as '' or 'None'."""
    if isinstance(value, str) and value.strip() in ("", "None", "null"):
        return None
    return value


def flag(name: str, value: Any) -> bool:
    """A templated true/false argument as a bool (ValueError naming it)."""
    try:
        return _BOOL.validate_python(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(f"{name}: expected true or false, got {value!r}") from None
