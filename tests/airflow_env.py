"""The test run's one Airflow home: a temporary AIRFLOW_HOME with a SQLite database, the
repository's dags/ as the DAG folder and no example DAGs.

Airflow reads this environment when it is first imported, so tests/conftest.py imports this
module before any test module can import airflow. Everything Airflow in the run shares it:
tests that import airflow, the `airflow ...` commands they start and the e2e services.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

if "airflow" in sys.modules:  # its configuration is already read: ours would be ignored
    raise RuntimeError("airflow was imported before tests/airflow_env.py set AIRFLOW_HOME; "
                       "import tests.airflow_env first (tests/conftest.py does)")

AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="ringflow-airflow-home-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, True)
os.environ.update(
    AIRFLOW_HOME=str(AIRFLOW_HOME),
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{AIRFLOW_HOME}/airflow.db",
    AIRFLOW__CORE__UNIT_TEST_MODE="False",
    # TPTrainOperator's default log and checkpoint folders: inside the run's home, not ~
    RINGFLOW_HOME=str(AIRFLOW_HOME / "ringflow"),
    # the host lists the PopRun example DAG's form offers (Airflow Variable), as a deployment
    # sets them: the tests' hosts; read when the DAG file is parsed
    AIRFLOW_VAR_RINGFLOW_POPRUN_HOSTS='["localhost", "n1,n2", "127.0.0.1"]',
)


def migrate() -> None:
    """`airflow db migrate` on the run's home (idempotent; about 6 s on an empty home)."""
    out = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=os.environ,
                         capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed ({out.returncode}):\n"
                           f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
