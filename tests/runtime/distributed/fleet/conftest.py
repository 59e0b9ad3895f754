"""Fleet test fixtures: no worker env contract leaks in from the shell, and each test starts
with a fresh module-level fleet, whose state is put back afterwards."""

from __future__ import annotations

import os

import pytest

from ringflow.distributed import fleet


@pytest.fixture(autouse=True)
def _no_paddle_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PADDLE_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _fresh_fleet():
    saved = dict(fleet._fleet.__dict__)
    fleet._fleet.__dict__.update(fleet.Fleet().__dict__)
    yield
    fleet._fleet.__dict__.clear()
    fleet._fleet.__dict__.update(saved)
