"""ringflow's DistributedStrategy against the real PaddlePaddle's: no option missing, none
extra, no default that differs (scripts/compare_paddle_strategy.py). PaddlePaddle is not a
dependency (its CPU wheel is 195 MB): its facts were recorded from paddlepaddle 3.3.1 with
`compare_paddle_strategy.py --record` into paddle_strategy_3.3.1.json, and the comparison runs
against them here; the script compares with paddle itself where it is installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parents[3] / "scripts" / "compare_paddle_strategy.py"
FACTS = json.loads((HERE / "paddle_strategy_3.3.1.json").read_text())


def compare_module():
    spec = importlib.util.spec_from_file_location("compare_paddle_strategy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_facts_are_paddle_3_3_1s_59_options():
    assert FACTS["paddle_version"] == "3.3.1"
    assert len(FACTS["options"]) == 59
    assert FACTS["defaults"]["hybrid_configs"]["mp_degree"] == 1
    assert FACTS["attributes"]["hybrid_parallel_order"] == ["dp", "pp", "sharding", "sep", "cp",
                                                           "mp"]


def test_every_option_and_default_is_paddles():
    found, compared = compare_module().differences(FACTS)
    assert found == []
    assert compared == 58   # the 59 options but build_strategy (ringflow's own)


def test_a_default_that_differs_or_an_option_missing_is_found():
    facts = json.loads(json.dumps(FACTS))
    facts["defaults"]["gradient_merge_configs"]["k_steps"] = 7
    facts["options"].append("pipeline_everything")
    found, _ = compare_module().differences(facts)
    assert found == ["missing in ringflow: pipeline_everything",
                     "default of gradient_merge_configs: Paddle {'avg': True, 'k_steps': 7}, "
                     "ringflow {'k_steps': 1, 'avg': True}"]
