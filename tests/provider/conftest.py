"""Provider fixtures: a real OpenSSH server on 127.0.0.1 and the Airflow connections to it.

The run's Airflow home (AIRFLOW_HOME and friends) and the `airflow_home` fixture are suite-wide:
tests/airflow_env.py and tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.airflow_env import REPO, VENV_BIN

__all__ = ["REPO", "VENV_BIN"]  # imported from here by the provider tests

SSHD = Path("/usr/sbin/sshd")
CONN_ID = "ringflow_test_ssh"
BAD_KEY_CONN_ID = "ringflow_test_ssh_badkey"


def wait_until(predicate, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


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


@dataclass
class NetnsHost:
    """A host in its own network namespace behind a veth pair, running its own sshd (same
    keys and port as the `sshd` fixture's), which a test can make vanish: its end of the
    link goes down, so packets to it are dropped without a FIN or RST, as when a machine
    loses power."""

    name: str
    address: str
    host_veth: str

    def vanish(self) -> None:
        subprocess.run(["ip", "netns", "exec", self.name, "ip", "link", "set", "dev", "eth0",
                        "down"], check=True, timeout=10)


def _free_subnet() -> str:
    """10.<a>.<b>.0/30 that no interface of this machine uses."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                          check=True, timeout=10).stdout
    rng = random.Random()
    while True:
        prefix = f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 250)}."
        if prefix not in used:
            return prefix


@pytest.fixture
def netns_host(sshd, tmp_path):
    """A NetnsHost; the namespace, the link, its sshd and everything its sessions started
    are gone afterwards. Needs root (make test and CI run as root)."""
    tag = f"rf{os.getpid() % 10000}{random.randrange(1000)}"
    name, host_veth, prefix = f"{tag}ns", f"{tag}h", _free_subnet()
    address = prefix + "2"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_veth, "type", "veth", "peer", "name", f"{tag}p"],
        ["ip", "link", "set", f"{tag}p", "netns", name],
        ["ip", "netns", "exec", name, "ip", "link", "set", f"{tag}p", "name", "eth0"],
        ["ip", "addr", "add", prefix + "1/30", "dev", host_veth],
        ["ip", "link", "set", host_veth, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", address + "/30", "dev", "eth0"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
    ]
    config = tmp_path / "sshd_config"
    config.write_text((sshd.home.parent / "sshd_config").read_text()
                      .replace("ListenAddress 127.0.0.1", f"ListenAddress {address}")
                      .replace(f"PidFile {sshd.home.parent}/sshd.pid",
                               f"PidFile {tmp_path}/sshd.pid"))
    proc = None
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=10)
            if done.returncode != 0:
                pytest.fail(f"cannot make a network-namespace host ({' '.join(step)}: "
                            f"{done.stderr.strip()}); these tests need root and iproute2")
        with open(tmp_path / "sshd.log", "wb") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", name, str(SSHD), "-D", "-e", "-f",
                                     str(config)], stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True)
        wait_until(lambda: _accepts(sshd.port, address) or proc.poll() is not None, 10,
                   "the namespace's sshd to listen")
        if proc.poll() is not None:
            pytest.fail(f"sshd in {name} exited: {(tmp_path / 'sshd.log').read_text()}")
        yield NetnsHost(name, address, host_veth)
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        _kill_netns_processes(name)
        subprocess.run(["ip", "link", "del", host_veth], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def _kill_netns_processes(name: str) -> None:
    """SIGKILL what sessions of the namespace's sshd left running there (detached jobs)."""
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                            timeout=10).stdout.split()
    for pid in listed:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
