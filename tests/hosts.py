"""Test hosts that are real hosts (issue 11): each in its own network, PID, mount, IPC and UTS
namespaces, with its own address on one bridge, its own `/tmp`, `/dev/shm` and home, and its
own OpenSSH server with generated keys; `/usr` (Debian's python3 and python3-numpy) is the
machine's. Needs root, iproute2, util-linux and openssh-server (`make sysdeps`).

Importable by any test package or benchmark (no pytest here): ``with NsHosts(3) as hosts:``,
or the suite-wide session fixture ``ns_hosts`` (tests/conftest.py). Names carry this
process's id, so concurrent runs never clash, and what a run killed by SIGKILL left behind is
swept by the next run.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests import host_network as net
from tests.host_network import HostSetupError

__all__ = ["HostProcess", "HostSetupError", "NsHost", "NsHosts"]

SSHD = "/usr/sbin/sshd"
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # `python3` on a host is Debian's /usr/bin/python3
READY_TIMEOUT_S = 10
_PR_SET_PDEATHSIG = 1

# Runs in the host's fresh mount namespace, then becomes its pid 1: the bind mounts come
# before the tmpfs on /tmp, which hides the machine's /tmp (and $D) from the host.
_SETUP = """set -e
exec >>"$D/init.log" 2>&1
mount --bind "$D/etc" /etc/ssh
mount --bind "$D/home" /root
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
hostname "$N"
exec /usr/bin/python3 -c "$INIT"
"""
# pid 1 of the host: starts its sshd and reaps every orphan, so a host never shows zombies.
_INIT = """import os, subprocess, time
subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config"])
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""
_SSHD_TITLE = "sshd: /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config"  # as sshd retitles itself


@dataclass(frozen=True)
class HostProcess:
    pid: int  # in the host's PID namespace
    ppid: int
    cmdline: str


@dataclass
class NsHost:
    """One host. `root` is its folder on the machine (etc/ is its /etc/ssh, home/ its
    /root); `init_pid` is its pid 1 as the machine numbers it."""

    name: str
    address: str
    netns: str
    veth: str  # the machine's end of its link, in the bridge
    root: Path
    key_file: Path  # the private key the machine (and every host) logs in with
    host_key_line: str  # "<type> <base64>", as the `host_key` connection extra takes it
    init_pid: int = 0
    pid_ns: str = ""  # "pid:[inode]" of its PID namespace
    ssh_port: int = 22
    user: str = "root"

    @property
    def home(self) -> Path:
        """Its home directory (/root inside the host) as the machine sees it."""
        return self.root / "home"

    def connection(self, **extra: str) -> dict:
        """An Airflow `ssh` connection (dict form) to this host, its host key pinned."""
        return {"conn_type": "ssh", "host": self.address, "port": self.ssh_port,
                "login": self.user,
                "extra": {"key_file": str(self.key_file), "host_key": self.host_key_line,
                          "look_for_keys": "false", **extra}}

    def connection_json(self, **extra: str) -> str:
        """The connection as `AIRFLOW_CONN_<ID>` takes it."""
        return json.dumps(self.connection(**extra))

    def run(self, argv: Sequence[str], timeout: float = 30, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run `argv` inside every namespace of the host (as root, cwd /, its PATH)."""
        environ = {"PATH": HOST_PATH, "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}
        return subprocess.run(
            ["nsenter", f"--target={self.init_pid}", "--net", "--pid", "--mount", "--ipc",
             "--uts", "--", *argv], input=input, capture_output=True, text=True,
            timeout=timeout, env=environ, cwd="/")

    def sh(self, script: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return self.run(["sh", "-c", script], timeout=timeout)

    def processes(self) -> list[HostProcess]:
        """Every process of the host, read from its own /proc (its PID namespace's, mounted
        in its mount namespace) through its pid 1's root."""
        found = []
        proc = Path(f"/proc/{self.init_pid}/root/proc")
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # ended meanwhile
            after_name = stat[stat.rfind(")") + 2:].split()
            if after_name[0] in "ZX":
                continue
            found.append(HostProcess(int(entry.name), int(after_name[1]),
                                     cmdline.replace(b"\0", b" ").decode("utf-8", "replace")
                                     .strip()))
        return sorted(found, key=lambda p: p.pid)

    def leftovers(self) -> list[HostProcess]:
        """The host's processes other than its own (pid 1 and its sshd listener): what the
        jobs and sessions started and is still alive."""
        return [p for p in self.processes()
                if p.pid != 1 and not (p.ppid == 1 and p.cmdline.startswith(_SSHD_TITLE))]

    def shm_entries(self) -> list[str]:
        """The names in the host's own /dev/shm."""
        return sorted(os.listdir(f"/proc/{self.init_pid}/root/dev/shm"))

    def vanish(self) -> None:
        """Its end of the link goes down: packets to it are dropped without a FIN or RST,
        as when a machine loses power. `reappear` brings it back."""
        net.ip(["-n", self.netns, "link", "set", "dev", "eth0", "down"])

    def reappear(self) -> None:
        net.ip(["-n", self.netns, "link", "set", "dev", "eth0", "up"])

    def reconfigure_sshd(self, edit: Callable[[str], str]) -> None:
        """Its sshd_config rewritten by `edit`, and sshd made to re-read it (SIGHUP: the
        listener restarts; a caller waits for it to answer again)."""
        config = self.root / "etc" / "sshd_config"
        config.write_text(edit(config.read_text()))
        self.sh("kill -HUP $(cat /etc/ssh/sshd.pid)")
        time.sleep(0.5)


@dataclass(eq=False)
class NsHosts(Sequence[NsHost]):
    """`count` hosts on one bridge of a free /24 (the machine is .1, hosts .2, .3, ...).
    `start()` makes them (tearing down what it made if it fails); `close()` removes them
    and everything they ran, also from atexit if the caller never got to it."""

    count: int = 3
    hosts: list[NsHost] = field(default_factory=list)
    setup_s: float = 0.0
    teardown_s: float = 0.0

    def __post_init__(self) -> None:
        # rf<pid>s<set>: with a kind and an index, at most 15 characters (an interface's)
        self.tag = f"rf{os.getpid()}s{next(_SET_NUMBERS)}"
        self.bridge = f"{self.tag}br"
        self.network: ipaddress.IPv4Network | None = None
        self.root: Path | None = None
        self._inits: list[subprocess.Popen] = []
        self._made_links: list[str] = []
        self._made_netns: list[str] = []
        self._closed = False

    def __getitem__(self, index):
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self) -> Iterator[NsHost]:
        return iter(self.hosts)

    def __enter__(self) -> NsHosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def gateway(self) -> str:
        """The machine's address on the bridge."""
        assert self.network is not None
        return str(self.network.network_address + 1)

    def connections(self, prefix: str) -> dict[str, str]:
        """Connection id `<prefix>_<i>` -> JSON, one per host (set them as
        AIRFLOW_CONN_<ID> environment variables)."""
        return {f"{prefix}_{i}": host.connection_json() for i, host in enumerate(self.hosts)}

    # making -------------------------------------------------------------------------------
    def start(self) -> NsHosts:
        started = time.monotonic()
        _LIVE.add(self)
        try:
            _check_tools()
            net.sweep_stale()
            self.root = Path(tempfile.mkdtemp(prefix=f"{net.TMP_PREFIX}{os.getpid()}-"))
            self._make_keys()
            self._make_network()
            for host in self.hosts:
                self._start_host(host)
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.setup_s = time.monotonic() - started
        return self

    def _make_keys(self) -> None:
        assert self.root is not None
        client = self.root / "client"
        client.mkdir()
        for i in range(self.count):
            (self.root / f"h{i}" / "etc").mkdir(parents=True)
            (self.root / f"h{i}" / "home" / ".ssh").mkdir(parents=True, mode=0o700)
        paths = [client / "id_ed25519"] + [
            self.root / f"h{i}" / "etc" / "ssh_host_ed25519_key" for i in range(self.count)]
        jobs = [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "",
                                  "-f", str(p)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE) for p in paths]
        for job, path in zip(jobs, paths):
            _, err = job.communicate(timeout=net.STEP_TIMEOUT_S)
            if job.returncode != 0:
                raise HostSetupError(f"cannot make namespace hosts: ssh-keygen {path}: "
                                     f"{err.decode().strip()}")

    def _make_network(self) -> None:
        assert self.root is not None
        net.ip(["link", "add", self.bridge, "type", "bridge"])
        self._made_links.append(self.bridge)
        self.network = net.claim_subnet(self.bridge)
        lines = [f"link set {self.bridge} up"]
        for i in range(self.count):
            netns, veth, peer = f"{self.tag}h{i}", f"{self.tag}v{i}", f"{self.tag}p{i}"
            self._made_netns.append(netns)
            self._made_links.append(veth)
            lines += [f"netns add {netns}", f"link add {veth} type veth peer name {peer}",
                      f"link set {peer} netns {netns}", f"link set {veth} master {self.bridge}",
                      f"link set {veth} up"]
        net.ip_batch([], lines)
        for i in range(self.count):
            netns, peer = f"{self.tag}h{i}", f"{self.tag}p{i}"
            address = str(self.network.network_address + 2 + i)
            net.ip_batch(["-n", netns], [f"link set {peer} name eth0",
                                      f"addr add {address}/24 dev eth0",
                                      "link set eth0 up", "link set lo up"])
            d = self.root / f"h{i}"
            key = (d / "etc" / "ssh_host_ed25519_key.pub").read_text().split()
            self.hosts.append(NsHost(netns, address, netns, f"{self.tag}v{i}", d,
                                     self.root / "client" / "id_ed25519", " ".join(key[:2])))
        self._write_ssh_files()

    def _write_ssh_files(self) -> None:
        """Each host: its sshd config; its home authorizes the one client key and holds it
        with every host's key in known_hosts, so the hosts also SSH to each other."""
        assert self.root is not None
        client = self.root / "client" / "id_ed25519"
        known = "".join(f"{h.address} {h.host_key_line}\n" for h in self.hosts)
        for host in self.hosts:
            (host.root / "etc" / "sshd_config").write_text(_sshd_config(host.address))
            ssh = host.home / ".ssh"
            shutil.copy(client.with_suffix(".pub"), ssh / "authorized_keys")
            shutil.copy(client, ssh / "id_ed25519")
            (ssh / "known_hosts").write_text(known)

    def _start_host(self, host: NsHost) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        env = {"PATH": HOST_PATH, "D": str(host.root), "N": host.name, "INIT": _INIT}
        # --kill-child and the parent-death signal: if this process dies, even by SIGKILL,
        # unshare dies, and with it the host's pid 1 and so every process of the host.
        init = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--pid", "--fork", "--kill-child",
             "--mount-proc", "--mount", "--ipc", "--uts", "--propagation", "private",
             "/bin/sh", "-c", _SETUP],
            env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        self._inits.append(init)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for host, init in zip(self.hosts, self._inits):
            while True:
                if not host.init_pid:
                    host.init_pid = _only_child(init.pid)
                if host.init_pid and not host.pid_ns:
                    with contextlib.suppress(OSError):
                        host.pid_ns = os.readlink(f"/proc/{host.init_pid}/ns/pid")
                if host.init_pid and _accepts(host.address, host.ssh_port):
                    break
                if init.poll() is not None or time.monotonic() > deadline:
                    log = host.root / "init.log"
                    raise HostSetupError(
                        f"namespace host {host.name} ({host.address}) did not start its sshd "
                        f"within {READY_TIMEOUT_S} s: "
                        f"{log.read_text().strip() if log.exists() else 'no log'}")
                time.sleep(0.02)
        # The readiness probes' connections have sshd children that end by themselves.
        for host in self.hosts:
            while host.leftovers():
                if time.monotonic() > deadline:
                    raise HostSetupError(f"namespace host {host.name}: processes other than "
                                         f"its init and sshd at start: {host.leftovers()}")
                time.sleep(0.02)

    def reboot(self, host: NsHost) -> None:
        """The host loses power and boots again: its pid 1 is killed (every process of the
        host dies with it, and its PID, mount, IPC and UTS namespaces, /tmp and /dev/shm
        go), then made again with its sshd. Its home (its disk), address and host key
        stay."""
        index = self.hosts.index(host)
        with contextlib.suppress(ProcessLookupError):
            os.kill(host.init_pid, signal.SIGKILL)
        self._inits[index].wait(timeout=net.STEP_TIMEOUT_S)
        host.init_pid, host.pid_ns = 0, ""
        self._start_host(host)
        self._inits[index] = self._inits.pop()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (host.init_pid and host.pid_ns and _accepts(host.address, host.ssh_port)):
            if time.monotonic() > deadline:
                raise HostSetupError(f"namespace host {host.name} did not boot again within "
                                     f"{READY_TIMEOUT_S} s")
            host.init_pid = host.init_pid or _only_child(self._inits[index].pid)
            if host.init_pid and not host.pid_ns:
                with contextlib.suppress(OSError):
                    host.pid_ns = os.readlink(f"/proc/{host.init_pid}/ns/pid")
            time.sleep(0.02)

    # removing -----------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every host's pid 1 (the kernel kills the rest of its PID namespace), then
        remove links, bridge, namespaces and folders. Idempotent."""
        if self._closed:
            return
        self._closed = True
        started = time.monotonic()
        for host in self.hosts:
            if host.init_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(host.init_pid, signal.SIGKILL)
        for init in self._inits:
            # unshare reaps the host's pid 1, which exits once its namespace is empty.
            try:
                init.wait(timeout=net.STEP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(init.pid, signal.SIGKILL)
                init.wait(timeout=net.STEP_TIMEOUT_S)
        for netns in self._made_netns:
            net.kill_netns_processes(netns)  # what entered only the network namespace
        net.remove(self._made_links, self._made_netns)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        _LIVE.discard(self)
        self.teardown_s = time.monotonic() - started

    def remains(self) -> list[str]:
        """What of this set still exists on the machine: namespaces, links, processes in
        its hosts' PID namespaces, its folder. Empty after `close()`."""
        left = [f"netns {n}" for n in net.netns_names() if n in self._made_netns]
        left += [f"link {n}" for n in net.link_names() if n in self._made_links]
        pid_ns = {h.pid_ns for h in self.hosts if h.pid_ns}
        left += [f"pid {pid} in a host's PID namespace" for pid in _pids_in(pid_ns)]
        left += [f"pid {pid} in netns {n}" for n in self._made_netns
                 for pid in net.netns_pids(n)]
        if self.root is not None and self.root.exists():
            left.append(f"folder {self.root}")
        return left


_SET_NUMBERS = itertools.count(1)
_LIVE: set[NsHosts] = set()


@atexit.register
def _close_all() -> None:
    for hosts in list(_LIVE):
        hosts.close()


def _sshd_config(address: str) -> str:
    return (
        f"Port 22\nListenAddress {address}\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PidFile /etc/ssh/sshd.pid\nAuthorizedKeysFile .ssh/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxStartups 100:30:200\nMaxSessions 100\nLogLevel ERROR\n"
        "Subsystem sftp internal-sftp\n"
        f"SetEnv PATH={HOST_PATH}\n"
    )


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _check_tools() -> None:
    if os.geteuid() != 0:
        raise HostSetupError("cannot make namespace hosts: they need root (make test and CI "
                             "run as root)")
    missing = [tool for tool in ("ip", "unshare", "nsenter", "ssh-keygen")
               if shutil.which(tool) is None]
    if not os.path.exists(SSHD):
        missing.append(SSHD)
    if missing:
        raise HostSetupError(f"cannot make namespace hosts: {', '.join(missing)} missing "
                             "(iproute2, util-linux, openssh-server: run `make sysdeps`)")


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _only_child(pid: int) -> int:
    """The child unshare forked (the host's pid 1), 0 while there is none yet."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(children[0]) if children else 0


def _pids_in(pid_namespaces: set[str]) -> list[int]:
    """The machine's pids whose PID namespace is one of `pid_namespaces` ("pid:[inode]")."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "pid") in pid_namespaces:
                    found.append(int(entry.name))
    return found
