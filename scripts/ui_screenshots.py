"""The README's pictures of the training views in the Airflow UI, made by the e2e tests that
check them (tests/e2e/test_training_ui.py): real Airflow services, the example DAG trained
twice, Debian's Chromium. Writes docs/images/training-tab.png, training-tab-dark.png and
training-runs-tab.png (about 3 minutes).

    .venv/bin/python scripts/ui_screenshots.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"


def main() -> int:
    IMAGES.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RINGFLOW_UI_SCREENSHOTS": str(IMAGES)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/e2e/test_training_ui.py", "-k", "training_tab_draws or training_runs_tab"]
    done = subprocess.run(argv, cwd=REPO, env=env, check=False)
    if done.returncode == 0:
        for picture in sorted(IMAGES.glob("training-*.png")):
            print(f"wrote {picture.relative_to(REPO)}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
