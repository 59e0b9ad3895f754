"""Lazy package exports (PEP 562): a name is imported from its module when first used, so
``import ringflow`` in a worker stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# public name -> (module, attribute or None for the module itself)
Exports = dict[str, tuple[str, str | None]]


def lazy_exports(package: str, namespace: dict[str, Any],
                 exports: Exports) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` for ``exports``;
    a resolved name is cached in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        try:
            module, attr = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
