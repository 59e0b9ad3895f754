"""Suite-wide fixtures. Area fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_default_programs(monkeypatch):
    """Each test starts with empty default main/startup programs and global scope."""
    from ringflow import executor
    from ringflow.framework import program

    monkeypatch.setattr(program, "_main_program", program.Program())
    monkeypatch.setattr(program, "_startup_program", program.Program())
    monkeypatch.setattr(executor, "_global_scope", executor.Scope())
    yield
