"""Fixtures of the collective tests: `spawn` starts real worker processes and reaps them."""

from __future__ import annotations

import pytest

from tests.runtime.distributed.spawn import Spawner


@pytest.fixture
def spawn(tmp_path):
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()
