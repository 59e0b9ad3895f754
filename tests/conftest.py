"""Suite-wide fixtures. Area fixtures live in tests/<area>/conftest.py.

The run's one Airflow home is set up by importing tests.airflow_env first, before any test
module can import airflow; `airflow_home` migrates its database once and `airflow_services`
starts real Airflow services on it once. Each pytest-xdist worker is its own process, so it
has its own home, database and services. Tests that use the services run last, in one
worker (`pytest_collection_modifyitems`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import airflow_env
from tests.airflow_services import STOP_TIMEOUT_S, AirflowServices
from tests.hosts import HostSetupError, NsHosts


@pytest.fixture(autouse=True)
def _fresh_default_programs(monkeypatch):
    """Each test starts with empty default main/startup programs and global scope."""
    from ringflow import executor
    from ringflow.framework import program

    monkeypatch.setattr(program, "_main_program", program.Program())
    monkeypatch.setattr(program, "_startup_program", program.Program())
    monkeypatch.setattr(executor, "_global_scope", executor.Scope())
    yield


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The run's Airflow home (tests/airflow_env.py) with its SQLite database migrated, once
    per run."""
    airflow_env.migrate()
    return airflow_env.AIRFLOW_HOME


@pytest.fixture(scope="session")
def airflow_services(airflow_home, tmp_path_factory):
    """api-server, scheduler (LocalExecutor) and dag-processor on 127.0.0.1 with the run's
    Airflow home, started once (about 15 s) and stopped after the last test that uses them.

    Yields an `AirflowServices` (tests/airflow_services.py): `.base_url` (UI and REST root),
    `.api` (REST client logged in as `admin`), `.admin_password` (SimpleAuthManager's
    generated password, as `airflow standalone` makes it), `.log_dir` (one log per service,
    task logs under logs/; kept in pytest's tmp dir and shown when a test using them fails).
    Teardown fails if any process they started is still alive after they were stopped.
    """
    services = AirflowServices(airflow_home, tmp_path_factory.mktemp("airflow-services"))
    try:
        services.start()
    except RuntimeError as exc:
        services.stop()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield services
    finally:
        leftovers = services.stop()
    assert not leftovers, (f"Airflow service processes still alive after SIGTERM and "
                           f"{STOP_TIMEOUT_S:.0f} s (killed): {leftovers}")


@pytest.fixture(scope="session")
def ns_hosts() -> NsHosts:
    """Three hosts that are real hosts (tests/hosts.py), made once per run (well under a
    second) and removed after it, also when a test fails or the run is interrupted: each
    with its own network, PID, mount, IPC and UTS namespaces, address on one bridge, /tmp,
    /dev/shm, home and OpenSSH server; `/usr` (Debian's python3 + python3-numpy) shared.
    Each `NsHost` gives `.address`, `.connection_json()` (an `ssh` connection with its host
    key pinned), `.run(argv)` inside its namespaces, `.leftovers()`, `.shm_entries()` and
    `.vanish()`. Fails (never skips) where namespaces cannot be made."""
    hosts = NsHosts(3)
    try:
        hosts.start()
    except HostSetupError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield hosts
    finally:
        hosts.close()


NS_CONN_PREFIX = "ringflow_ns"


@pytest.fixture
def ns_conns(ns_hosts, monkeypatch) -> list[str]:
    """Airflow connection ids `ringflow_ns_<i>`, one per `ns_hosts` host (its key pinned),
    set as AIRFLOW_CONN_<ID> for this test."""
    for conn_id, conn in ns_hosts.connections(NS_CONN_PREFIX).items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", conn)
    return [f"{NS_CONN_PREFIX}_{i}" for i in range(len(ns_hosts))]


def pytest_collection_modifyitems(config, items):
    """Tests that use the Airflow services run last (stable otherwise): the session fixture
    stops the services after the last of them. Under pytest-xdist (`make test`) they are one
    group, so one worker starts the services once and runs them all."""
    items.sort(key=lambda item: "airflow_services" in getattr(item, "fixturenames", ()))
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if "airflow_services" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group("airflow_services"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    services = getattr(item, "funcargs", {}).get("airflow_services")
    if report.failed and isinstance(services, AirflowServices):
        report.sections.append(("Airflow services", services.log_tails()))
    return report
