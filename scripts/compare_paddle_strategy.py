"""Compare ringflow's fleet ``DistributedStrategy`` with PaddlePaddle's: the public option
names and every default (messages field by field, float32 proto fields at float32
precision). Run it with a Python that has PaddlePaddle installed (it is not a dependency of
ringflow; the CPU wheel is enough):

    python -m venv /tmp/pd && /tmp/pd/bin/pip install paddlepaddle==3.3.1
    /tmp/pd/bin/python scripts/compare_paddle_strategy.py
    /tmp/pd/bin/python scripts/compare_paddle_strategy.py --record FILE   # Paddle's facts

Prints one line per difference and exits 1 if there is any, else prints the count of
options compared and exits 0. `--against FILE` compares with facts recorded before (no
paddle needed): the test suite does so with
tests/runtime/distributed/fleet/paddle_strategy_3.3.1.json, recorded from the CPU wheel.
``build_strategy`` is left out of the defaults: ringflow's takes its own ``BuildStrategy``
(its switches are not Paddle's).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "provider"))


def _plain(value: Any) -> Any:
    """Paddle's getter value as plain Python (protobuf messages and containers as dicts and
    lists, floats rounded to float32 as the proto stores them)."""
    import numpy as np

    if hasattr(value, "DESCRIPTOR") and hasattr(value, "ListFields"):
        return {f.name: _plain(getattr(value, f.name)) for f in value.DESCRIPTOR.fields}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__.startswith("Repeated"):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return float(np.float32(value))
    return value


def paddle_facts() -> dict[str, Any]:
    """What PaddlePaddle's DistributedStrategy is: its version, public options, their
    defaults (as plain Python) and the two plain attributes compared."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    import paddle
    import paddle.distributed.fleet as paddle_fleet

    theirs_cls = paddle_fleet.DistributedStrategy
    names = sorted(n for n, v in vars(theirs_cls).items()
                   if isinstance(v, property) and not n.startswith("_"))
    theirs = theirs_cls()
    return {"paddle_version": paddle.__version__, "options": names,
            "defaults": {n: _plain(getattr(theirs, n)) for n in names if n != "build_strategy"},
            "attributes": {n: _plain(getattr(theirs, n))
                           for n in ("hybrid_parallel_order", "sync_param_name")}}


def differences(facts: dict[str, Any]) -> tuple[list[str], int]:
    """(the differences between ringflow's DistributedStrategy and `facts` (paddle_facts'),
    the number of options whose defaults were compared)."""
    from ringflow.distributed.strategy import DistributedStrategy

    their_names = set(facts["options"])
    our_names = {n for n in dir(DistributedStrategy) if not n.startswith("_")} - {
        "save_to_prototxt", "load_from_prototxt"}
    found = [f"missing in ringflow: {n}" for n in sorted(their_names - our_names)]
    found += [f"not in Paddle: {n}" for n in sorted(our_names - their_names)]
    ours = DistributedStrategy()
    compared = 0
    for name in sorted(their_names & our_names - {"build_strategy"}):
        expected, actual = facts["defaults"][name], _plain(getattr(ours, name))
        compared += 1
        if expected != actual:
            found.append(f"default of {name}: Paddle {expected!r}, ringflow {actual!r}")
    for name, expected in facts["attributes"].items():
        if _plain(getattr(ours, name)) != expected:
            found.append(f"{name}: Paddle {expected!r}, ringflow {getattr(ours, name)!r}")
    return found, compared


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", metavar="FILE",
                        help="write PaddlePaddle's facts (needs paddle) to FILE as JSON")
    parser.add_argument("--against", metavar="FILE",
                        help="compare with facts recorded in FILE instead of paddle itself")
    args = parser.parse_args(argv)
    if args.against:
        facts = json.loads(Path(args.against).read_text())
    else:
        facts = paddle_facts()
    if args.record:
        Path(args.record).write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
        print(f"PaddlePaddle {facts['paddle_version']}: {len(facts['options'])} options "
              f"recorded in {args.record}")
        return 0
    found, compared = differences(facts)
    for line in found:
        print(line)
    print(f"{compared} options compared with PaddlePaddle {facts['paddle_version']}, "
          f"{len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
