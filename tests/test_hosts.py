"""The namespace test hosts (tests/hosts.py) are hosts: own address, SSH server and keys,
/tmp, /dev/shm, home and PIDs; Debian's python3 + numpy; reachable from each other; and
nothing of them remains after teardown."""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from ringflow.errors import LaunchError
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from tests import procs
from tests.hosts import HostSetupError, NsHosts

pytestmark = [pytest.mark.ssh]


@pytest.fixture
def hooks(ns_hosts, ns_conns):
    made = [MultiHostSSHHook(conn_id, conn_timeout=5) for conn_id in ns_conns]
    yield made
    for hook in made:
        hook.close()


def ssh(hooks, ns_hosts, i: int, command: str) -> str:
    code, out, err = hooks[i].run(ns_hosts[i].address, command, timeout=20)
    assert code == 0, f"{command!r} on {ns_hosts[i].name}: exit {code}: {err}"
    return out


def test_each_host_has_its_own_address_on_the_bridge(ns_hosts):
    addresses = [host.address for host in ns_hosts]
    assert len(set(addresses)) == 3
    for host in ns_hosts:
        shown = host.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout.split()
        assert shown[3] == f"{host.address}/24"
        assert host.address.startswith(ns_hosts.gateway.rsplit(".", 1)[0] + ".")


def test_each_host_answers_over_ssh_with_its_own_name(hooks, ns_hosts):
    assert [ssh(hooks, ns_hosts, i, "hostname").strip() for i in range(3)] == [
        host.name for host in ns_hosts]


def test_each_host_has_its_own_generated_host_key(ns_hosts, monkeypatch):
    assert len({host.host_key_line for host in ns_hosts}) == 3
    other = ns_hosts[1].connection_json().replace(ns_hosts[1].address, ns_hosts[0].address)
    monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_NS_WRONG_KEY", other)
    hook = MultiHostSSHHook("ringflow_ns_wrong_key", conn_timeout=5)
    with pytest.raises(LaunchError, match="BadHostKeyException"):
        hook.connect(ns_hosts[0].address)


def test_tmp_dev_shm_and_home_are_private_to_each_host(hooks, ns_hosts):
    name = f"ringflow-private-{uuid.uuid4().hex[:8]}"
    ssh(hooks, ns_hosts, 0, f"touch /tmp/{name} /dev/shm/{name} ~/{name}")
    assert ns_hosts[0].shm_entries() == [name]
    assert (ns_hosts[0].home / name).exists()
    for path in (f"/tmp/{name}", f"/dev/shm/{name}", f"/root/{name}"):
        assert not Path(path).exists()  # not on the machine
        assert ssh(hooks, ns_hosts, 1, f"test -e {path} && echo there || echo absent") == (
            "absent\n")
    ssh(hooks, ns_hosts, 0, f"rm /tmp/{name} /dev/shm/{name} ~/{name}")


def test_each_host_sees_only_its_own_processes_under_its_own_pid_1(hooks, ns_hosts):
    for i in range(len(ns_hosts)):
        init = ssh(hooks, ns_hosts, i, "tr '\\0' ' ' < /proc/1/cmdline")
        assert init.startswith("/usr/bin/python3 -c import os, subprocess, time")
        pids = {int(p) for p in ssh(hooks, ns_hosts, i, "ps -eo pid=").split()}
        assert 1 in pids and os.getpid() not in pids
        # pid 1, the sshd listener, this session's sshd processes, its shell and ps
        assert len(pids) < 10
    assert ns_hosts[0].processes()[0].pid == 1


def test_python3_on_the_hosts_is_debians_with_its_numpy(hooks, ns_hosts):
    debian = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3-numpy"],
                            capture_output=True, text=True, timeout=10).stdout
    upstream = debian.split(":")[-1].split("-")[0]  # 1:1.24.2-1+deb12u1 -> 1.24.2
    out = ssh(hooks, ns_hosts, 2, "command -v python3; /usr/bin/python3 -c "
              + shlex.quote("import numpy; print(numpy.__version__, numpy.__file__)"))
    which, version, where = out.split()
    assert which == "/usr/bin/python3"
    assert version == upstream
    assert where.startswith("/usr/lib/python3/dist-packages/numpy/")


def test_every_host_reaches_every_other_host_over_tcp(hooks, ns_hosts):
    probe = ("import socket, sys\n"
             "with socket.create_connection((sys.argv[1], 22), timeout=5) as s:\n"
             "    print(s.recv(64).decode().split('-')[0])\n")
    for i in range(3):
        for j, other in enumerate(ns_hosts):
            if i != j:
                out = ssh(hooks, ns_hosts, i, f"python3 -c {shlex.quote(probe)} {other.address}")
                assert out == "SSH\n", (i, j)


def test_the_hosts_ssh_to_each_other_with_the_same_key(hooks, ns_hosts):
    out = ssh(hooks, ns_hosts, 0, f"ssh -o BatchMode=yes {ns_hosts[2].address} hostname")
    assert out.strip() == ns_hosts[2].name


def test_leftovers_and_shm_entries_show_what_a_session_left(hooks, ns_hosts):
    host = ns_hosts[1]
    assert host.leftovers() == []
    ssh(hooks, ns_hosts, 1, "setsid sleep 300 < /dev/null > /dev/null 2>&1 & "
        "echo x > /dev/shm/ringflow-left")
    hooks[1].close()  # its session's sshd processes end with the connection
    try:
        assert procs.eventually(lambda: [p.cmdline for p in host.leftovers()] == ["sleep 300"])
        assert host.shm_entries() == ["ringflow-left"]
    finally:
        host.sh("pkill -x sleep; rm -f /dev/shm/ringflow-left")  # only this host's pid ns
    assert host.leftovers() == [] and host.shm_entries() == []


def test_nothing_of_a_set_of_hosts_remains_after_teardown():
    hosts = NsHosts(2).start()
    hosts[0].sh("setsid sleep 300 < /dev/null > /dev/null 2>&1 & touch /dev/shm/ringflow-x")
    names = [host.netns for host in hosts] + [host.veth for host in hosts] + [hosts.bridge]
    assert len(hosts[0].leftovers()) == 1
    hosts.close()
    assert hosts.remains() == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                           timeout=10).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout
    assert not [name for name in names if name in links or name in netns]
    assert not Path(f"/proc/{hosts[0].init_pid}").exists()
    print(f"2 hosts: setup {hosts.setup_s:.2f} s, teardown {hosts.teardown_s:.2f} s")


def test_missing_tools_fail_with_a_message_that_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without iproute2 and friends
    with pytest.raises(HostSetupError, match=r"ip, unshare, nsenter, ssh-keygen missing "
                                             r"\(iproute2, util-linux, openssh-server"):
        NsHosts(1).start()
