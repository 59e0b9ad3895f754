"""The runtime on training hosts (issue 11): a preflight that finds each host's interpreter
and numpy and holds them against the runtime's floors (`ringflow.floors`), and the `ringflow`
package shipped by SFTP into a cache folder of each host's home, named by its version and
content hash, installed atomically, read-only, and reused only after it is verified.

On a host (`~` is the SSH login's home)::

    ~/.ringflow/runtime/<version>-<hash>/ringflow/...        the package (PYTHONPATH: the folder)
    ~/.ringflow/runtime/<version>-<hash>/RINGFLOW_MANIFEST   sha256 of every file (sha256sum -c)
    ~/.ringflow/runtime/<version>-<hash>/RINGFLOW_RUNTIME    the full hash, written last
    ~/.ringflow/runtime/.<version>-<hash>.tmp-<random>/      an install in progress

An install uploads into a temporary folder of its own, makes it read-only (files 0444,
folders 0555), then renames it onto the target: the rename is atomic, so a job, or another
host sharing the home, sees no copy or a whole one. When the target appeared meanwhile
(another job won), the existing copy is kept and the temporary one removed; temporaries
older than STALE_TMP_S (left by a killed ship) are removed.

A copy the cache has is used only when every file's sha256 is this runtime's, no file was
added and every mode is still read-only (`verify_command`, run by the host's python);
otherwise the copy is set aside and a fresh one installed in its place, and the task log
says what was wrong. Python's own `__pycache__` folders are removed by that check and not
compared (a root login writes them despite the modes).
"""

from __future__ import annotations

import errno
import re
import secrets
import shlex
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TypeVar

import paramiko

from ringflow.errors import LaunchError, gathered
from ringflow.floors import NUMPY_FLOOR, PYTHON_FLOOR, text
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.launchers.runtime_copy import (
    DIR_MODE,
    FILE_MODE,
    MANIFEST,
    MARKER,
    RuntimeBundle,
    differences,
    runtime_bundle,
    verify_command,
)

__all__ = ["CACHE_DIR", "MANIFEST", "MARKER", "HostPython", "Prepared", "RuntimeBundle",
           "Shipped", "preflight", "prepare_hosts", "runtime_bundle", "ship_runtime",
           "ship_to"]

CACHE_DIR = ".ringflow/runtime"
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


# shipping ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shipped:
    """Where the runtime is on a host; `uploaded_files` is 0 when the cache had it."""

    host: str
    pythonpath: str
    uploaded_files: int
    installed: bool  # this ship's copy became the cache's
    replaced: str = ""  # why the cache's copy was not used (it failed verification)


def ship_runtime(hooks: Hooks, hosts: Sequence[str], bundle: RuntimeBundle | None = None,
                 timeout: float = TIMEOUT_S, python: str = "python3") -> dict[str, Shipped]:
    """Ship `bundle` (default: the installed runtime) to every host at once; one
    LaunchError names every host that failed."""
    bundle = bundle or runtime_bundle()
    return _on_every_host(hosts, lambda host: ship_to(_hook(hooks, host), host, bundle,
                                                      timeout, python), "shipping the runtime")


def ship_to(hook: MultiHostSSHHook, host: str, bundle: RuntimeBundle,
            timeout: float = TIMEOUT_S, python: str = "python3") -> Shipped:
    """Ship `bundle` to `host` unless its cache has it, verified with the host's `python`
    (see the module's docstring)."""
    sftp = hook.open_sftp(host, timeout)
    try:
        return _Install(hook, host, sftp, bundle, timeout, python).run()
    except (OSError, paramiko.SSHException) as exc:
        cause = (f"no SFTP reply within {timeout} s" if isinstance(exc, TimeoutError)
                 else f"{type(exc).__name__}: {exc}")
        raise LaunchError(f"host {host!r}: shipping the runtime ({bundle.name}) failed: "
                          f"{cause}") from exc
    finally:
        sftp.close()


class _Install:
    def __init__(self, hook: MultiHostSSHHook, host: str, sftp: paramiko.SFTPClient,
                 bundle: RuntimeBundle, timeout: float, python: str = "python3"):
        self.hook, self.host, self.sftp, self.bundle, self.timeout = (
            hook, host, sftp, bundle, timeout)
        self.python = python
        self.replaced = ""  # why the cache's copy was not used
        self.base = f"{sftp.normalize('.')}/{CACHE_DIR}"
        self.target = f"{self.base}/{bundle.name}"

    def run(self) -> Shipped:
        if self._complete(self.target):
            wrong = self._verify(self.target)
            if not wrong:
                return Shipped(self.host, self.target, 0, installed=False)
            self.replaced = "; ".join(wrong)
            self._set_aside(self.target)
        self._makedirs(self.base)
        temporary = f"{self.base}/.{self.bundle.name}.tmp-{secrets.token_hex(6)}"
        self.sftp.mkdir(temporary)
        try:
            self._sweep(now=self.sftp.stat(temporary).st_mtime or 0)
            count = self._upload(temporary)
            self._make_read_only(temporary)
            installed = self._place(temporary)
        except BaseException:
            self._remove(temporary, quiet=True)
            raise
        return Shipped(self.host, self.target, count, installed, self.replaced)

    def _verify(self, folder: str) -> list[str]:
        """What is wrong with the copy in `folder` (empty: it is this bundle, read-only)."""
        code, out, err = self.hook.run(self.host, verify_command(self.python, folder),
                                       timeout=self.timeout)
        if code != 0:
            last = (err.strip().splitlines() or [f"exit {code}"])[-1]
            return [f"it could not be verified: {last}"]
        return differences(self.bundle, out)

    def _set_aside(self, folder: str) -> None:
        """A copy that failed verification is renamed out of the way, then removed."""
        aside = f"{self.base}/.{self.bundle.name}.old-{secrets.token_hex(6)}"
        try:
            self.sftp.posix_rename(folder, aside)
        except OSError:
            if self._exists(folder):
                raise
            return  # another ship set it aside first
        self._remove(aside, quiet=True)

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
        with self.sftp.open(f"{temporary}/{MANIFEST}", "w") as manifest:
            manifest.write(self.bundle.manifest())
        with self.sftp.open(f"{temporary}/{MARKER}", "w") as marker:
            marker.write(self.bundle.digest + "\n")
        return len(self.bundle.files)

    def _make_read_only(self, folder: str) -> None:
        q = shlex.quote(folder)
        code, _, err = self.hook.run(
            self.host, f"find {q} -type f -exec chmod {FILE_MODE:o} {{}} + && "
                       f"find {q} -type d -exec chmod {DIR_MODE:o} {{}} +", timeout=self.timeout)
        if code != 0:
            raise LaunchError(f"host {self.host!r}: cannot make {folder} read-only: "
                              f"{err.strip()}")

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
        self.replaced = self.replaced or f"{MARKER} was missing or not this runtime's"
        aside = f"{self.base}/.{self.bundle.name}.old-{secrets.token_hex(6)}"
        self.sftp.posix_rename(self.target, aside)
        self.sftp.posix_rename(temporary, self.target)
        self._remove(aside)
        return True

    def _remove(self, folder: str, quiet: bool = False) -> None:
        q = shlex.quote(folder)  # a copy is read-only: its folders made writable first
        try:
            code, _, err = self.hook.run(
                self.host, f"chmod -R u+w -- {q} 2>/dev/null; rm -rf -- {q}",
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
        replaced = (f" (the copy there was not this runtime and was replaced: "
                    f"{self.shipped.replaced})" if self.shipped.replaced else "")
        return (f"host {self.python.host}: {self.python.python} is Python "
                f"{text(self.python.python_version)} {numpy}; "
                f"runtime {how} at {self.shipped.pythonpath}"
                f"{'' if self.shipped.uploaded_files else ' (its files verified)'}{replaced}")


def prepare_hosts(hooks: Hooks, hosts: Sequence[str], python: str = "python3",
                  timeout: float = TIMEOUT_S, numpy: bool = True) -> dict[str, Prepared]:
    """Preflight every host, then ship the runtime to all of them; use
    ``PYTHONPATH=<result[host].shipped.pythonpath> <python> -m ringflow.launch ...``."""
    found = preflight(hooks, hosts, python, timeout, numpy)
    shipped = ship_runtime(hooks, hosts, timeout=timeout, python=python)
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
