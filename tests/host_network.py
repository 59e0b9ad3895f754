"""The machine side of the namespace test hosts (tests/hosts.py): iproute2 calls, a free
subnet, and the names a run made, which carry its pid so that what a run killed by SIGKILL
left can be told from what a live run owns and swept."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

STEP_TIMEOUT_S = 10
TMP_PREFIX = "ringflow-hosts-"  # + <pid>-: a run's folder
# rf<pid>s<set><kind><index>: a run's bridge (br), namespaces (h), links (v, p)
_NAME_RE = re.compile(r"^rf(\d+)s\d+(br|[hvp]\d+)$")


class HostSetupError(RuntimeError):
    """The namespace hosts cannot be made here (no root, no iproute2, ...)."""


def ip(args: list[str]) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise HostSetupError(f"cannot make namespace hosts: `ip {' '.join(args)}`: "
                             f"{done.stderr.strip()} (they need root and iproute2)")
    return done.stdout


def ip_batch(options: list[str], lines: list[str]) -> None:
    done = subprocess.run(["ip", *options, "-batch", "-"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise HostSetupError(f"cannot make namespace hosts: `ip {' '.join(options)} -batch` "
                             f"of {lines}: {done.stderr.strip()} (they need root and iproute2)")


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in ip(["-4", "-o", "addr"]).splitlines():
        nets.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in ip(["-4", "route", "show", "table", "all"]).splitlines():
        for token in line.split()[:2]:  # "10.1.2.0/24 dev ..." or "local 127.0.0.1 dev ..."
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.ip_network(token, strict=False))
                break
    return nets


def claim_subnet(bridge: str) -> ipaddress.IPv4Network:
    """A random 10.a.b.0/24 that no address or route of the machine overlaps, its .1 put on
    `bridge`; checked again after, so two runs choosing at once cannot both keep it."""
    rng = random.Random()
    for _ in range(50):
        net = ipaddress.ip_network(f"10.{rng.randrange(16, 255)}.{rng.randrange(256)}.0/24")
        if any(net.overlaps(used) for used in _used_networks()):
            continue
        ip(["addr", "add", f"{net.network_address + 1}/24", "dev", bridge])
        others = [line for line in ip(["-4", "-o", "addr"]).splitlines()
                  if line.split()[1] != bridge
                  and ipaddress.ip_interface(line.split()[3]).network.overlaps(net)]
        if not others:
            return net
        ip(["addr", "del", f"{net.network_address + 1}/24", "dev", bridge])
    raise HostSetupError("cannot make namespace hosts: no free 10.x.y.0/24 found")


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=STEP_TIMEOUT_S).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def link_names() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                         timeout=STEP_TIMEOUT_S).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                         timeout=STEP_TIMEOUT_S).stdout
    return [int(pid) for pid in out.split()]


def kill_netns_processes(netns: str) -> None:
    for pid in netns_pids(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove(links: list[str], netns: list[str]) -> None:
    lines = [f"link del {name}" for name in reversed(links)]
    lines += [f"netns del {name}" for name in netns]
    if lines:  # -force: go on past what is already gone
        subprocess.run(["ip", "-force", "-batch", "-"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=STEP_TIMEOUT_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove the namespaces, links and folders of runs whose process is gone (a run killed
    by SIGKILL had no chance to); returns what it removed."""
    def stale(name: str) -> bool:
        match = _NAME_RE.match(name)
        return bool(match) and not _alive(int(match.group(1)))

    netns = [n for n in netns_names() if stale(n)]
    links = [n for n in link_names() if stale(n)]
    for name in netns:
        kill_netns_processes(name)
    remove(links, netns)
    folders = []
    for folder in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        pid = folder.name[len(TMP_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            folders.append(str(folder))
    return [*netns, *links, *folders]
