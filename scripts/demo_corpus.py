"""Writes the example DAG's text corpus (package data of the example DAGs,
provider/ringflow_provider/example_dags/data/ringflow_corpus.txt): the project's own README.md
and the sources of its training runtime (provider/ringflow/train/*.py), joined in that order.
The file is checked in, so the corpus (and what the demo's model reaches on it) stays the same
while the README and the sources change; run this to renew it.

    python scripts/demo_corpus.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["README.md", *sorted(str(p.relative_to(REPO))
                                for p in (REPO / "provider/ringflow/train").glob("*.py"))]
CORPUS = REPO / "provider" / "ringflow_provider" / "example_dags" / "data" / "ringflow_corpus.txt"


def build() -> str:
    parts = [(REPO / name).read_text(encoding="utf-8") for name in SOURCES]
    return "\n".join(part if part.endswith("\n") else part + "\n" for part in parts)


def main() -> int:
    text = build()
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    CORPUS.write_text(text, encoding="utf-8")
    print(f"{CORPUS.relative_to(REPO)}: {len(text):,} characters, {len(set(text))} distinct, "
          f"from {', '.join(SOURCES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
