"""``ship_data``: a job's data file or folder copied from the worker to every host over
SFTP, once. On a host (``~`` is the SSH login's home)::

    ~/.ringflow/data/<sha256[:16]>/<name>       the file, or the folder's files
    ~/.ringflow/data/<sha256[:16]>/DATA_SHA256  the full digest, written last

The upload goes to a temporary folder that is renamed onto the target (another job shipping
the same data at once keeps one whole copy); the host then computes the digest of what it
has (``ringflow.launch.digest``, the runtime shipped), and a copy whose digest differs is
refused. A later job finds the marker and the digest again, and reuses the copy; a copy
whose bytes changed on the host since is replaced."""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import shlex
from dataclasses import dataclass

from ringflow.errors import LaunchError
from ringflow.launch.digest import data_files, digest

DATA_DIR = ".ringflow/data"
MARKER = "DATA_SHA256"
DIGEST_MODULE = "ringflow.launch.digest"


@dataclass(frozen=True)
class ShippedData:
    """Where a host has the data (relative to its home, as the job reads it)."""

    host: str
    path: str
    uploaded_files: int


def remote_path(local: str, sha: str) -> str:
    return posixpath.join(DATA_DIR, sha[:16], os.path.basename(os.path.normpath(local)))


def ship_data_to(launcher, host: str, local: str, sha: str) -> ShippedData:
    """``local`` (digest ``sha``) on ``host`` through an SSH launcher after ``prepare``."""
    target = remote_path(local, sha)
    folder = posixpath.dirname(target)
    found = _remote_digest(launcher, host, folder, target)
    if found == sha:
        return ShippedData(host, target, 0)
    if found is not None:   # a copy whose bytes changed on the host: replaced
        launcher.run(host, f"cd && rm -rf {shlex.quote(folder)}")
    temporary = f"{DATA_DIR}/.{sha[:16]}.tmp-{secrets.token_hex(4)}"
    files = _upload(launcher, host, local, posixpath.join(temporary, posixpath.basename(
        target)))
    launcher.put_file(host, posixpath.join(temporary, MARKER), sha + "\n")
    code, _, err = launcher.run(host, f"cd && (mv -T {shlex.quote(temporary)} "
                                      f"{shlex.quote(folder)} 2>/dev/null || "
                                      f"rm -rf {shlex.quote(temporary)})")
    if code != 0:
        raise LaunchError(f"host {host!r}: cannot place the data in {folder}: {err.strip()}")
    found = _remote_digest(launcher, host, folder, target)
    if found != sha:
        raise LaunchError(f"host {host!r}: the data shipped to {target} has digest "
                          f"{found}, not the worker's {sha}: refused")
    return ShippedData(host, target, files)


def _remote_digest(launcher, host: str, folder: str, target: str) -> str | None:
    """The digest the host computes of its copy, if its marker is there; else None."""
    marker = posixpath.join(folder, MARKER)
    code, _, _ = launcher.run(host, f"cd && test -f {shlex.quote(marker)}")
    if code != 0:
        return None
    code, out, _ = launcher.run(host, "cd && " + launcher.runtime(host).module(
        DIGEST_MODULE, target))
    return out.strip() if code == 0 else None


def _upload(launcher, host: str, local: str, target: str) -> int:
    names = data_files(local)
    root = local if os.path.isdir(local) else None
    sftp = launcher.hook(host).open_sftp(host)
    try:
        made: set[str] = set()
        for name in names:
            dest = posixpath.join(target, os.path.relpath(name, root).replace(os.sep, "/")) \
                if root else target
            _makedirs(sftp, posixpath.dirname(dest), made)
            sftp.put(name, dest)
    except OSError as exc:
        raise LaunchError(f"host {host!r}: uploading the data {local} failed: {exc}") from exc
    finally:
        sftp.close()
    return len(names)


def _makedirs(sftp, folder: str, made: set[str]) -> None:
    parts = folder.split("/")
    for i in range(1, len(parts) + 1):
        path = "/".join(parts[:i])
        if path and path not in made:
            with contextlib.suppress(OSError):   # there already (another job, a part)
                sftp.mkdir(path)
            made.add(path)


def ship_job_data(launcher, spec, log):
    """``spec`` (a JobSpec) with its ``data`` and ``eval_data`` files shipped to every host
    of ``launcher`` (after its ``prepare``) and their paths replaced by the hosts' copies;
    synthetic data and None pass as they are."""
    import dataclasses

    changes = {}
    for field in ("data", "eval_data"):
        local = getattr(spec, field)
        if local is None or local == "synthetic":
            continue
        local = os.path.expanduser(local)
        if not os.path.exists(local):
            raise LaunchError(f"ship_data: {field} {local!r} is not on this worker")
        sha = digest(local)
        shipped = launcher.on_every_host(
            lambda h, local=local, sha=sha: ship_data_to(launcher, h, local, sha),
            f"shipping {field}")
        for host, done in shipped.items():
            how = f"uploaded {done.uploaded_files} file(s)" if done.uploaded_files else \
                "reused (digest checked)"
            log.info("host %s: %s %s %s at ~/%s (sha256 %s)", host, field, local, how,
                     done.path, sha[:16])
        changes[field] = remote_path(local, sha)
    return dataclasses.replace(spec, **changes) if changes else spec


__all__ = ["ShippedData", "digest", "remote_path", "ship_data_to", "ship_job_data"]
