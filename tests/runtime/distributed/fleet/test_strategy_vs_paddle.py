"""ringflow's DistributedStrategy against the real PaddlePaddle's: no option missing, none
extra, no default that differs (scripts/compare_paddle_strategy.py). PaddlePaddle is not a
dependency: this runs where it is importable (a CI job with the CPU wheel), and is skipped,
not passed, elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("paddle", reason="PaddlePaddle is not installed (optional check)")

SCRIPT = Path(__file__).resolve().parents[4] / "scripts" / "compare_paddle_strategy.py"


def test_every_option_and_default_is_paddles():
    spec = importlib.util.spec_from_file_location("compare_paddle_strategy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found, compared = module.differences()
    assert found == []
    assert compared == 58   # the 59 options but build_strategy (ringflow's own)
