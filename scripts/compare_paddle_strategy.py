"""Compare ringflow's fleet ``DistributedStrategy`` with PaddlePaddle's: the public option
names and every default (messages field by field, float32 proto fields at float32
precision). Run it with a Python that has PaddlePaddle installed (it is not a dependency of
ringflow; the CPU wheel is enough):

    python -m venv /tmp/pd && /tmp/pd/bin/pip install paddlepaddle==3.3.1
    /tmp/pd/bin/python scripts/compare_paddle_strategy.py

Prints one line per difference and exits 1 if there is any, else prints the count of
options compared and exits 0. ``build_strategy`` is left out of the defaults: ringflow's
takes its own ``BuildStrategy`` (its switches are not Paddle's).
"""

from __future__ import annotations

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


def differences() -> tuple[list[str], int]:
    """(the differences found, the number of options compared)."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    import paddle.distributed.fleet as paddle_fleet

    from ringflow.distributed.strategy import DistributedStrategy

    theirs_cls = paddle_fleet.DistributedStrategy
    their_names = {n for n, v in vars(theirs_cls).items()
                   if isinstance(v, property) and not n.startswith("_")}
    our_names = {n for n in dir(DistributedStrategy) if not n.startswith("_")} - {
        "save_to_prototxt", "load_from_prototxt"}
    found = [f"missing in ringflow: {n}" for n in sorted(their_names - our_names)]
    found += [f"not in Paddle: {n}" for n in sorted(our_names - their_names)]
    theirs, ours = theirs_cls(), DistributedStrategy()
    compared = 0
    for name in sorted(their_names & our_names - {"build_strategy"}):
        expected, actual = _plain(getattr(theirs, name)), _plain(getattr(ours, name))
        compared += 1
        if expected != actual:
            found.append(f"default of {name}: Paddle {expected!r}, ringflow {actual!r}")
    for name in ("hybrid_parallel_order", "sync_param_name"):
        if getattr(theirs, name) != getattr(ours, name):
            found.append(f"{name}: Paddle {getattr(theirs, name)!r}, ringflow "
                         f"{getattr(ours, name)!r}")
    return found, compared


def main() -> int:
    found, compared = differences()
    for line in found:
        print(line)
    print(f"{compared} options compared with PaddlePaddle, {len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
