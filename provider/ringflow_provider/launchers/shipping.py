"""The runtime on training hosts (issue 11): a preflight that finds each host's interpreter
and numpy and holds them against the runtime's floors (`ringflow.floors`), and the `ringflow`
package shipped by SFTP into a cache folder of each host's home, named by its version and
content hash, installed atomically and reused.

On a host (`~` is the SSH login's home)::

    ~/.ringflow/runtime/<version>-<hash>/ringflow/...        the package (PYTHONPATH: the folder)
    ~/.ringflow/runtime/<version>-<hash>/RINGFLOW_RUNTIME    the full hash, written last
    ~/.ringflow/runtime/.<version>-<hash>.tmp-<random>/      an install in progress

An install uploads into a temporary folder of its own, then renames it onto the target:
the rename is atomic, so a job, or another host sharing the home, sees no copy or a whole
one. When the target appeared meanwhile (another job won), the existing copy is kept and the
temporary one removed; temporaries older than STALE_TMP_S (left by a killed ship) are removed.
"""

from __future__ import annotations

import errno
import hashlib
import re
import secrets
import shlex
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

import paramiko

import ringflow
from ringflow.errors import LaunchError, gathered
from ringflow.floors import NUMPY_FLOOR, PYTHON_FLOOR, text
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook

__all__ = ["HostPython", "Prepared", "RuntimeBundle", "Shipped", "preflight", "prepare_hosts",
           "runtime_bundle", "ship_runtime", "ship_to"]

CACHE_DIR = ".ringflow/runtime"
MARKER = "RINGFLOW_RUNTIME"
PACKAGE_DATA = ("py.typed",)  # files besides *.py that belong to the package
STALE_TMP_S = 3600
TIMEOUT_S = 30  # each SFTP reply and each remote command
_MAX_HOSTS_AT_ONCE = 8
_TAG = "ringflow-probe"
# Runs under whatever the host calls python (also Python 2): one-argument print, % format.
_PROBE = f"""import sys
print('{_TAG} python %d.%d.%d' % tuple(sys.version_info[:3]))
try:
    import numpy
except Exception as exc:
    print('{_TAG} no-numpy %s: %s' % (type(exc).__name__, exc))
else:
    print('{_TAG} numpy %s' % numpy.__version__)
"""

Hooks = MultiHostSSHHook | Mapping[str, MultiHostSSHHook]
T = TypeVar("T")


# what is shipped ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RuntimeBundle:
    """The files of the local `ringflow` package that run on a host, and their hash."""

    root: Path
    files: tuple[str, ...]  # posix paths relative to `root`, sorted
    digest: str  # sha256 of every path and content

    @property
    def name(self) -> str:
        """The cache folder's name on the hosts."""
        return f"{ringflow.__version__}-{self.digest[:16]}"


def runtime_bundle(package_dir: Path | None = None) -> RuntimeBundle:
    """The installed `ringflow` package's .py files and package data (no __pycache__)."""
    root = Path(package_dir or Path(ringflow.__file__).parent)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts
                   and (p.suffix == ".py" or p.name in PACKAGE_DATA))
    digest = hashlib.sha256()
    for name in files:
        content = (root / name).read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return RuntimeBundle(root, tuple(files), digest.hexdigest())


# shipping ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shipped:
    """Where the runtime is on a host; `uploaded_files` is 0 when the cache had it."""

    host: str
    pythonpath: str
    uploaded_files: int
    installed: bool  # this ship's copy became the cache's


def ship_runtime(hooks: Hooks, hosts: Sequence[str], bundle: RuntimeBundle | None = None,
                 timeout: float = TIMEOUT_S) -> dict[str, Shipped]:
    """Ship `bundle` (default: the installed runtime) to every host at once; one
    LaunchError names every host that failed."""
    bundle = bundle or runtime_bundle()
    return _on_every_host(hosts, lambda host: ship_to(_hook(hooks, host), host, bundle,
                                                      timeout), "shipping the runtime")


def ship_to(hook: MultiHostSSHHook, host: str, bundle: RuntimeBundle,
            timeout: float = TIMEOUT_S) -> Shipped:
    """Ship `bundle` to `host` unless its cache has it (see the module's docstring)."""
    sftp = hook.open_sftp(host, timeout)
    try:
        return _Install(hook, host, sftp, bundle, timeout).run()
    except (OSError, paramiko.SSHException) as exc:
        cause = (f"no SFTP reply within {timeout} s" if isinstance(exc, TimeoutError)
                 else f"{type(exc).__name__}: {exc}")
        raise LaunchError(f"host {host!r}: shipping the runtime ({bundle.name}) failed: "
                          f"{cause}") from exc
    finally:
        sftp.close()


class _Install:
    def __init__(self, hook: MultiHostSSHHook, host: str, sftp: paramiko.SFTPClient,
                 bundle: RuntimeBundle, timeout: float):
        self.hook, self.host, self.sftp, self.bundle, self.timeout = (
            hook, host, sftp, bundle, timeout)
        self.base = f"{sftp.normalize('.')}/{CACHE_DIR}"
        self.target = f"{self.base}/{bundle.name}"

    def run(self) -> Shipped:
        if self._complete(self.target):
            return Shipped(self.host, self.target, 0, installed=False)
        self._makedirs(self.base)
        temporary = f"{self.base}/.{self.bundle.name}.tmp-{secrets.token_hex(6)}"
        self.sftp.mkdir(temporary)
        try:
            self._sweep(now=self.sftp.stat(temporary).st_mtime or 0)
            count = self._upload(temporary)
            installed = self._place(temporary)
        except BaseException:
            self._remove(temporary, quiet=True)
            raise
        return Shipped(self.host, self.target, count, installed)

    def _complete(self, folder: str) -> bool:
        try:
            with self.sftp.open(f"{folder}/{MARKER}", "r") as marker:
                return marker.read().decode().strip() == self.bundle.digest
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise

    def _makedirs(self, folder: str) -> None:
        path = PurePosixPath(folder)
        for parent in [*reversed(path.parents), path]:
            if self._exists(str(parent)):
                continue
            try:
                self.sftp.mkdir(str(parent))
            except OSError:
                # another ship made it meanwhile (sftp-server says only "Failure")
                if not self._exists(str(parent)):
                    raise

    def _exists(self, path: str) -> bool:
        try:
            self.sftp.stat(path)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def _sweep(self, now: float) -> None:
        """Remove temporaries that are older than STALE_TMP_S by the host's clock (`now`
        is the mtime of the folder just made there)."""
        for entry in self.sftp.listdir_attr(self.base):
            leftover = entry.filename.startswith(".") and (
                ".tmp-" in entry.filename or ".old-" in entry.filename)
            if leftover and now - (entry.st_mtime or now) > STALE_TMP_S:
                self._remove(f"{self.base}/{entry.filename}")

    def _upload(self, temporary: str) -> int:
        folders = {str(parent) for name in self.bundle.files
                   for parent in PurePosixPath("ringflow", name).parents if str(parent) != "."}
        for folder in sorted(folders, key=lambda f: f.count("/")):  # parents first
            self.sftp.mkdir(f"{temporary}/{folder}")
        for name in self.bundle.files:
            with open(self.bundle.root / name, "rb") as local:
                # confirm=False: a failed write raises on close, and the marker comes last
                self.sftp.putfo(local, f"{temporary}/ringflow/{name}", confirm=False)
        with self.sftp.open(f"{temporary}/{MARKER}", "w") as marker:
            marker.write(self.bundle.digest + "\n")
        return len(self.bundle.files)

    def _place(self, temporary: str) -> bool:
        """Rename `temporary` onto the target; False when another install got there first."""
        try:
            self.sftp.posix_rename(temporary, self.target)
            return True
        except OSError:
            if self._complete(self.target):
                self._remove(temporary)
                return False
        # A target without the marker was not made by a ship (they rename whole copies in):
        # set it aside, then take its place.
        aside = f"{self.base}/.{self.bundle.name}.old-{secrets.token_hex(6)}"
        self.sftp.posix_rename(self.target, aside)
        self.sftp.posix_rename(temporary, self.target)
        self._remove(aside)
        return True

    def _remove(self, folder: str, quiet: bool = False) -> None:
        try:
            code, _, err = self.hook.run(self.host, f"rm -rf -- {shlex.quote(folder)}",
                                         timeout=self.timeout)
        except LaunchError:
            if quiet:
                return
            raise
        if code != 0 and not quiet:
            raise LaunchError(f"host {self.host!r}: cannot remove {folder}: {err.strip()}")


# preflight ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostPython:
    host: str
    python: str
    python_version: tuple[int, ...]
    numpy_version: str


def preflight(hooks: Hooks, hosts: Sequence[str], python: str = "python3",
              timeout: float = TIMEOUT_S, numpy: bool = True) -> dict[str, HostPython]:
    """`python` on every host (at once) is at least ringflow's Python floor and (unless
    `numpy` is False: the host runs only ringflow's job supervisor) imports a numpy at least
    at its floor; else one LaunchError naming every failing host and what was found there."""
    def check(host: str) -> HostPython:
        code, out, err = _hook(hooks, host).run(host, probe_command(python), timeout=timeout)
        return read_probe(host, python, code, out, err, numpy)

    return _on_every_host(hosts, check, "preflight")


def probe_command(python: str) -> str:
    return f"{shlex.quote(python)} -c {shlex.quote(_PROBE)}"


def read_probe(host: str, python: str, code: int, out: str, err: str,
               numpy: bool = True) -> HostPython:
    """The probe's answer, or LaunchError saying what is missing or too old on `host`."""
    found = dict(line.split(" ", 2)[1:] for line in out.splitlines()
                 if line.startswith(f"{_TAG} ") and line.count(" ") >= 2)
    if "python" not in found:
        if code == 127:
            raise LaunchError(f"host {host!r}: python {python!r} not found (exit 127)")
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise LaunchError(f"host {host!r}: {python} could not run the probe (exit {code}): "
                          f"{last}")
    version = _leading_ints(found["python"])
    if version < PYTHON_FLOOR:
        raise LaunchError(f"host {host!r}: {python} is Python {found['python']}, older than "
                          f"ringflow's floor {text(PYTHON_FLOOR)}")
    if not numpy:
        return HostPython(host, python, version, found.get("numpy", ""))
    if "no-numpy" in found:
        raise LaunchError(f"host {host!r}: {python} has no numpy ({found['no-numpy']}; "
                          "pip/apt install numpy)")
    numpy_version = found.get("numpy", "")
    if not numpy_version or _leading_ints(numpy_version) < NUMPY_FLOOR:
        raise LaunchError(f"host {host!r}: {python} has numpy {numpy_version or '?'}, older "
                          f"than ringflow's floor {text(NUMPY_FLOOR)}")
    return HostPython(host, python, version, numpy_version)


def _leading_ints(version: str) -> tuple[int, ...]:
    """(1, 24, 2) from '1.24.2', (2, 1) from '2.1.0rc1'... only the dotted leading numbers."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


# both -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    python: HostPython
    shipped: Shipped

    def describe(self) -> str:
        """One task-log line: what the host runs and whether the cache had the runtime."""
        how = "uploaded" if self.shipped.uploaded_files else "reused"
        numpy = (f"with numpy {self.python.numpy_version}" if self.python.numpy_version
                 else "(numpy not needed there)")
        return (f"host {self.python.host}: {self.python.python} is Python "
                f"{text(self.python.python_version)} {numpy}; "
                f"runtime {how} at {self.shipped.pythonpath}")


def prepare_hosts(hooks: Hooks, hosts: Sequence[str], python: str = "python3",
                  timeout: float = TIMEOUT_S, numpy: bool = True) -> dict[str, Prepared]:
    """Preflight every host, then ship the runtime to all of them; use
    ``PYTHONPATH=<result[host].shipped.pythonpath> <python> -m ringflow.launch ...``."""
    found = preflight(hooks, hosts, python, timeout, numpy)
    shipped = ship_runtime(hooks, hosts, timeout=timeout)
    return {host: Prepared(found[host], shipped[host]) for host in hosts}


def _hook(hooks: Hooks, host: str) -> MultiHostSSHHook:
    return hooks if isinstance(hooks, MultiHostSSHHook) else hooks[host]


def _on_every_host(hosts: Sequence[str], work: Callable[[str], T], what: str) -> dict[str, T]:
    """`work(host)` for every host at once; LaunchError naming every host that failed."""
    def attempt(host: str) -> T | LaunchError:
        try:
            return work(host)
        except LaunchError as exc:
            return exc

    targets = list(dict.fromkeys(hosts))
    with ThreadPoolExecutor(max_workers=max(1, min(_MAX_HOSTS_AT_ONCE, len(targets)))) as pool:
        results = dict(zip(targets, pool.map(attempt, targets)))
    problems = [r for r in results.values() if isinstance(r, LaunchError)]
    if problems:
        raise gathered(what, problems)
    return results  # type: ignore[return-value]
