"""What a shipped copy of the runtime is (`shipping`): the local `ringflow` package's files,
their hashes and the manifest written beside them, and the check that a host's copy is still
exactly that, read-only (`verify_command` lists the copy with the host's python,
`differences` compares the listing with the bundle)."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import ringflow

MARKER = "RINGFLOW_RUNTIME"
MANIFEST = "RINGFLOW_MANIFEST"
FILE_MODE, DIR_MODE = 0o444, 0o555  # a shipped copy is read-only
PACKAGE_DATA = ("py.typed",)  # files besides *.py that belong to the package


@dataclass(frozen=True)
class RuntimeBundle:
    """The files of the local `ringflow` package that run on a host, and their hash."""

    root: Path
    files: tuple[str, ...]  # posix paths relative to `root`, sorted
    digest: str  # sha256 of every path and content
    hashes: tuple[str, ...] = ()  # sha256 of each file, in the order of `files`

    @property
    def name(self) -> str:
        """The cache folder's name on the hosts."""
        return f"{ringflow.__version__}-{self.digest[:16]}"

    def manifest(self) -> str:
        """RINGFLOW_MANIFEST: `sha256sum` lines of the copy's package files."""
        return "".join(f"{h}  ringflow/{f}\n" for f, h in zip(self.files, self.hashes))

    def expected(self) -> dict[str, tuple[str, int]]:
        """Every entry of a whole copy (paths relative to it) -> (sha256 or "dir", mode)."""
        entries: dict[str, tuple[str, int]] = {".": ("dir", DIR_MODE)}
        for name, digest in zip(self.files, self.hashes):
            entries[f"ringflow/{name}"] = (digest, FILE_MODE)
            for parent in PurePosixPath("ringflow", name).parents:
                if str(parent) != ".":
                    entries[str(parent)] = ("dir", DIR_MODE)
        entries[MANIFEST] = (hashlib.sha256(self.manifest().encode()).hexdigest(), FILE_MODE)
        entries[MARKER] = (hashlib.sha256(f"{self.digest}\n".encode()).hexdigest(),
                           FILE_MODE)
        return entries


def runtime_bundle(package_dir: Path | None = None) -> RuntimeBundle:
    """The installed `ringflow` package's .py files and package data (no __pycache__)."""
    root = Path(package_dir or Path(ringflow.__file__).parent)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts
                   and (p.suffix == ".py" or p.name in PACKAGE_DATA))
    digest, hashes = hashlib.sha256(), []
    for name in files:
        content = (root / name).read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
        hashes.append(hashlib.sha256(content).hexdigest())
    return RuntimeBundle(root, tuple(files), digest.hexdigest(), tuple(hashes))


# Runs under the host's python: every entry of a copy as `<sha256|dir|other> <mode> <path>`
# (relative, sorted). Python's __pycache__ folders are removed first and never listed: only a
# root login can have written them (the folders are read-only), and root removes them without
# making a folder writable first, which a check of another job running at the same moment
# would see as a changed mode and set the copy aside while a job uses it. One that cannot be
# removed (a job of that login writing it right now) is left to it.
_VERIFY = """import hashlib, os, shutil, stat, sys
root = sys.argv[1]
for top, dirs, files in os.walk(root):
    for d in [d for d in dirs if d == "__pycache__"]:
        dirs.remove(d)
        shutil.rmtree(os.path.join(top, d), ignore_errors=True)
out = []
for top, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
    for name in [top] + [os.path.join(top, f) for f in files + links]:
        st = os.lstat(name)
        if stat.S_ISREG(st.st_mode):
            with open(name, "rb") as f:
                what = hashlib.sha256(f.read()).hexdigest()
        else:
            what = "dir" if stat.S_ISDIR(st.st_mode) else "other"
        out.append("%s %o %s" % (what, stat.S_IMODE(st.st_mode), os.path.relpath(name, root)))
print("\\n".join(sorted(out)))
"""


def verify_command(python: str, folder: str) -> str:
    """Lists a copy on its host for `differences` (the login's home is the working folder)."""
    return f"cd && {shlex.quote(python)} -c {shlex.quote(_VERIFY)} {shlex.quote(folder)}"


def differences(bundle: RuntimeBundle, listing: str, limit: int = 3) -> list[str]:
    """How the copy that `verify_command` listed differs from `bundle` (empty: it is the
    bundle, read-only); at most `limit` items, then how many more."""
    expected, found = bundle.expected(), {}
    said = []
    for line in listing.splitlines():
        what, _, rest = line.partition(" ")
        mode, _, path = rest.partition(" ")
        found[path] = (what, int(mode, 8) if mode.isdigit() else -1)
    for path in sorted(set(expected) | set(found)):
        want, have = expected.get(path), found.get(path)
        if have is None:
            said.append(f"{path} is missing")
        elif want is None:
            said.append(f"{path} was added")
        elif have[0] != want[0]:
            said.append(f"{path} is not a folder" if want[0] == "dir" else
                        f"{path} is not a regular file" if have[0] in ("dir", "other") else
                        f"{path} differs from the shipped file (sha256 {have[0][:12]}...)")
        elif have[1] != want[1]:
            said.append(f"{path} has mode {have[1]:o}, not {want[1]:o}")
    more = len(said) - limit
    return said[:limit] + ([f"{more} more"] if more > 0 else [])
