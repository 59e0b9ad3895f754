"""The ports ringflow picks when none are given (`ringflow.launch.ports`): below the host's
ephemeral range (ip_local_port_range), each bound once to check it, as a single-host agent
picks them and as a launcher asks each host over SSH."""

from __future__ import annotations

import random
import socket
import subprocess
import sys

import pytest

from ringflow.errors import LaunchError
from ringflow.launch import ports
from ringflow.launch.config import parse_launch_args
from ringflow.launch.env import plan_endpoints


def range_file(tmp_path, low: int, high: int = 60999):
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{low}\t{high}\n")
    return str(path)


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    assert ports.ephemeral_range(range_file(tmp_path, 40000, 50000)) == (40000, 50000)
    assert ports.ephemeral_range(str(tmp_path / "none")) == ports.LINUX_EPHEMERAL


def test_the_window_ends_below_the_ephemeral_range():
    assert ports.base_window(4, 32768) == (20000, 32764)
    assert ports.base_window(4, 20010) == (20000, 20006)
    assert ports.base_window(4, 15000) == (1024, 14996)  # a host whose range starts low
    with pytest.raises(LaunchError, match="no 600 ports fit between 1024 and the ephemeral "
                                          "range of this host"):
        ports.base_window(600, 1500)


def test_a_picked_base_has_every_port_below_the_ephemeral_range(tmp_path):
    path = range_file(tmp_path, 20010)
    bases = {ports.pick_base_port(4, random.Random(seed), path) for seed in range(20)}
    assert bases and all(20000 <= base <= 20006 for base in bases)


def test_a_port_in_use_makes_the_range_busy_naming_it():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert ports.busy_port(port, 2).startswith(f"{port}: ")
    assert ports.busy_port(port, 1) is None


def test_the_command_line_prints_the_range_and_checks_a_range():
    run = [sys.executable, "-m", "ringflow.launch.ports"]
    out = subprocess.run([*run, "range"], capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == [str(p) for p in ports.ephemeral_range()]
    with socket.socket() as held:
        held.bind(("", 0))
        port = held.getsockname()[1]
        out = subprocess.run([*run, "check", str(port), "1"], capture_output=True, text=True,
                             timeout=30)
    assert (out.returncode, out.stdout.split()[:2]) == (1, ["busy", f"{port}:"])


def test_a_single_host_agent_picks_its_ranks_ports_below_the_ephemeral_range(tmp_path):
    (tmp_path / "train.py").write_text("")
    config = parse_launch_args(["--nproc-per-host", "4", "train.py"], cwd=tmp_path)
    low, _ = ports.ephemeral_range()
    found = [int(e.rsplit(":", 1)[1]) for e in plan_endpoints(config)]
    assert len(set(found)) == 4 and max(found) < low
    assert found == list(range(found[0], found[0] + 4))
