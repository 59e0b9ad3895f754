"""The docs' tensor-parallel example runs as printed: the script is taken from the fleet guide
(docs/guides/fleet.md, the block after ``<!-- example: tp_example.py -->``) and launched with
2 and 4 ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "fleet.md"


def readme_example(name: str) -> str:
    text = GUIDE.read_text()
    match = re.search(rf"<!-- example: {re.escape(name)} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"{GUIDE.name} has no example {name}"
    return match.group(1)


@pytest.mark.multiproc
@pytest.mark.parametrize("nproc", [2, 4])
def test_the_fleet_guides_tensor_parallel_example_trains_with_equal_losses_on_every_rank(
        launcher, nproc):
    launcher.script("tp_example.py", readme_example("tp_example.py"))
    done = launcher.run("--nproc-per-host", str(nproc), "tp_example.py", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    losses = {r: [float(line.split()[-1]) for line in done.lines(f"[rank {r}] step ")]
              for r in range(nproc)}
    assert len(losses[0]) == 5 and losses[0][-1] < losses[0][0] - 0.5
    assert all(losses[r] == losses[0] for r in range(nproc))   # printed to 6 digits
    for r in range(nproc):
        assert done.lines(f"[rank {r}] fc1.w here: ") == ["(64, 128)"]
