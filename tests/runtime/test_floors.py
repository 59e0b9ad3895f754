"""The runtime's floors (ringflow.floors, checked on hosts by the provider's preflight) are
what pyproject.toml promises."""

from __future__ import annotations

import re

import tomllib

from ringflow.floors import NUMPY_FLOOR, PYTHON_FLOOR
from tests.airflow_env import REPO


def test_the_floors_are_pyprojects_requires_python_and_numpy_pin():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=" + ".".join(map(str, PYTHON_FLOOR))
    pins = [d for d in project["dependencies"] if re.match(r"numpy\b", d)]
    assert pins == ["numpy>=" + ".".join(map(str, NUMPY_FLOOR))]
