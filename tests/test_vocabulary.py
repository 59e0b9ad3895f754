"""One vocabulary in what ringflow says (task log, plot, XCom, the demo, docstrings, the
README and the docs): a layout reads "mp 2 x dp 1", as Paddle's hybrid_configs name the
degrees, and the built-in model is the "transformer", never "GPT". Scans the code and the
pages that users read the words of."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("provider", "dags", "scripts")
# "tensor parallel 2 x", "data parallel {dp}", "data parallel rank {r}"; prose such as "each
# data-parallel rank holds" stays
DEGREE_IN_WORDS = re.compile(r"\b(?:tensor|data) parallel (?:rank )?(?:\d|%d|\{)", re.I)
GPT = re.compile(r"\bGPT\b")


def sources() -> list[Path]:
    return sorted([*(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py")),
                   REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").rglob("*.md")])


def said(pattern: re.Pattern[str]) -> list[str]:
    return [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
            for path in sources()
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line)]


def test_the_sources_are_found():
    names = {p.relative_to(REPO).as_posix() for p in sources()}
    assert {"dags/ringflow_tp_train.py", "scripts/demo_summary.py",
            "provider/ringflow_provider/operators/tp_train.py", "README.md",
            "docs/operators/tp-train.md", "docs/guides/fleet.md"} <= names


def test_a_layout_is_said_as_mp_and_dp_degrees():
    assert said(DEGREE_IN_WORDS) == []


def test_the_built_in_model_is_called_transformer_not_gpt():
    assert said(GPT) == []
