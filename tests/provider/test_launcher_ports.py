"""The base port a remote launcher picks when the operator is given none: below every host's
ephemeral range, each host's read over SSH (`ringflow.launch.ports`), every port bound on
every host first. On the namespace hosts, whose network namespaces each have their own
ip_local_port_range."""

from __future__ import annotations

import logging

import pytest

from ringflow.errors import LaunchError
from ringflow_provider.launchers.ssh import SSHLauncher

pytestmark = [pytest.mark.ssh]

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


@pytest.fixture
def launcher(ns_hosts, ns_conns):
    """An ssh launcher over the first two hosts, the runtime shipped; each host's own
    ephemeral range put back afterwards."""
    hosts = list(ns_hosts)[:2]
    before = [h.sh(f"cat {RANGE_FILE}").stdout.strip() for h in hosts]
    made = SSHLauncher([h.address for h in hosts], log=logging.getLogger("test_ports"),
                       python="/usr/bin/python3",
                       conns={h.address: c for h, c in zip(hosts, ns_conns)})
    made.prepare(numpy=False)
    yield made, hosts
    made.close()
    for host, text in zip(hosts, before):
        host.sh(f"echo '{text}' > {RANGE_FILE}")


def set_range(host, low: int, high: int = 60999) -> None:
    done = host.sh(f"echo '{low} {high}' > {RANGE_FILE} && cat {RANGE_FILE}")
    assert done.stdout.split() == [str(low), str(high)], done.stderr


def test_the_base_port_lies_below_every_hosts_ephemeral_range(launcher):
    made, (first, second) = launcher
    set_range(first, 30000)
    set_range(second, 20100)  # the lower one bounds the range
    bases = {made.free_base_port(4) for _ in range(3)}
    assert all(base >= 20000 and base + 3 < 20100 for base in bases), bases


def test_no_room_below_a_hosts_ephemeral_range_is_an_error_naming_the_host(launcher):
    made, (_, second) = launcher
    set_range(second, 1100)
    with pytest.raises(LaunchError) as err:
        made.free_base_port(100)
    assert str(err.value) == (
        f"no 100 ports fit between 1024 and the ephemeral range of host {second.address!r} "
        f"(from 1100, {RANGE_FILE}); pass a base port")
