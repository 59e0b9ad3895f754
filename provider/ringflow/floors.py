"""The oldest Python and numpy the runtime runs on: what a training host must have (the
provider's preflight checks them there). pyproject.toml states the same (requires-python,
numpy>=); a test keeps them equal. numpy 1.24 is Debian 12's, on which the namespace test
hosts run the runtime."""

from __future__ import annotations

PYTHON_FLOOR = (3, 10)
NUMPY_FLOOR = (1, 24)


def text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)
