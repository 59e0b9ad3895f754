"""Provider fixtures: a real OpenSSH server on 127.0.0.1 and the Airflow connections to it;
a namespace host of its own that a test may make vanish (the suite-wide three are
`ns_hosts`, tests/conftest.py).

The run's Airflow home (AIRFLOW_HOME and friends) and the `airflow_home` fixture are suite-wide:
tests/airflow_env.py and tests/conftest.py.
"""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.airflow_env import REPO, VENV_BIN
from tests.hosts import HostSetupError, NsHost, NsHosts

__all__ = ["REPO", "VENV_BIN"]  # imported from here by the provider tests

SSHD = Path("/usr/sbin/sshd")
CONN_ID = "ringflow_test_ssh"
BAD_KEY_CONN_ID = "ringflow_test_ssh_badkey"
NETNS_CONN_ID = "ringflow_test_netns"


def wait_until(predicate, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def hosts_connection(monkeypatch, home: Path, hosts, conn_id: str) -> None:
    """One ssh connection `conn_id` for every namespace host in `hosts` (the first host's,
    its host replaced per host), their host keys in a known_hosts of a test HOME `home`."""
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(
        "".join(f"{h.address} {h.host_key_line}\n" for h in hosts))
    monkeypatch.setenv("HOME", str(home))
    conn = hosts[0].connection()
    conn["extra"].pop("host_key")
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SSHServer:
    port: int
    user: str
    host_key_line: str  # "<type> <base64>", as the `host_key` connection extra takes it
    key_file: Path
    bad_key_file: Path
    bin_dir: Path
    state_dir: Path
    work_dir: Path
    home: Path


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, timeout=30)


def _sshd_config(d: Path, port: int, bin_dir: Path) -> Path:
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n"
        f"PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxStartups 100:30:200\nMaxSessions 100\nLogLevel ERROR\n"
        # as Debian's sshd_config: the runtime ships to a host over SFTP
        "Subsystem sftp internal-sftp\n"
        # The remote PATH starts with the stand-in poprun's directory; the remote HOME (where
        # jobs keep their pid files by default) is a temporary directory.
        f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin HOME={d}/home\n"
    )
    return config


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> SSHServer:
    """A real OpenSSH server on 127.0.0.1:<free port>, key auth only, killed at the end."""
    if not SSHD.exists():
        pytest.fail("sshd missing: run `make sysdeps` (installs openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "user_key", "bad_key"):
        _keygen(d / name)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    bin_dir = d / "bin"
    bin_dir.mkdir()
    (d / "home").mkdir()
    shutil.copy(Path(__file__).with_name("standin_poprun.py"), bin_dir / "poprun")
    (bin_dir / "poprun").chmod(0o755)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    port = free_port()
    config = _sshd_config(d, port, bin_dir)
    with open(d / "sshd.log", "wb") as log:
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_until(lambda: _accepts(port) or proc.poll() is not None, 10, "sshd to listen")
        if proc.poll() is not None:
            pytest.fail(f"sshd exited: {(d / 'sshd.log').read_text()}")
        host_key = " ".join((d / "host_key.pub").read_text().split()[:2])
        (d / "state").mkdir()
        (d / "work").mkdir()
        yield SSHServer(port, getpass.getuser(), host_key, d / "user_key", d / "bad_key",
                        bin_dir, d / "state", d / "work", d / "home")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _accepts(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def connection_json(server: SSHServer, key_file: Path, password: str | None = None) -> str:
    extra = {"key_file": str(key_file), "host_key": server.host_key_line,
             "look_for_keys": "false"}
    conn = {"conn_type": "ssh", "host": "127.0.0.1", "port": server.port,
            "login": server.user, "extra": extra}
    if password:
        conn["password"] = password
    return json.dumps(conn)


@pytest.fixture
def ssh_conn(sshd, monkeypatch) -> str:
    """The Airflow connections (AIRFLOW_CONN_<ID>, JSON form) to the test server."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                       connection_json(sshd, sshd.key_file, password="conn-pw-Zq81"))
    monkeypatch.setenv(f"AIRFLOW_CONN_{BAD_KEY_CONN_ID.upper()}",
                       connection_json(sshd, sshd.bad_key_file))
    return CONN_ID


@pytest.fixture
def netns_host(monkeypatch) -> NsHost:
    """A namespace host of its own (tests/hosts.py), which a test may make vanish
    (`.vanish()`); its Airflow connection is NETNS_CONN_ID. The host, its link and
    everything its sessions started are gone afterwards. Needs root (make test and CI run
    as root)."""
    hosts = NsHosts(1)
    try:
        hosts.start()
    except HostSetupError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        monkeypatch.setenv(f"AIRFLOW_CONN_{NETNS_CONN_ID.upper()}", hosts[0].connection_json())
        yield hosts[0]
    finally:
        hosts.close()
