"""Runtime shipping and preflight against the namespace hosts (tests/hosts.py): the cache
folder is installed whole or not at all, reused, shared safely by concurrent ships; missing
or old interpreters and numpy are named per host; and the shipped runtime runs on Debian's
python3 + numpy (1.24), not on the checkout's .venv."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import threading
import time

import paramiko
import pytest

from ringflow.errors import LaunchError
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.launchers import shipping
from ringflow_provider.launchers.shipping import (
    CACHE_DIR,
    MANIFEST,
    MARKER,
    preflight,
    read_probe,
    runtime_bundle,
    ship_runtime,
    ship_to,
)
from tests.provider.conftest import NETNS_CONN_ID, wait_until

pytestmark = [pytest.mark.ssh]

BUNDLE = runtime_bundle()


@pytest.fixture
def hooks(ns_hosts, ns_conns):
    """One hook per host, each host's runtime cache emptied first."""
    for host in ns_hosts:
        shutil.rmtree(host.home / ".ringflow", ignore_errors=True)
    made = {host.address: MultiHostSSHHook(conn_id, conn_timeout=5)
            for host, conn_id in zip(ns_hosts, ns_conns)}
    yield made
    for hook in made.values():
        hook.close()


def cache(host):
    """The host's cache folder, as the machine sees its home."""
    return host.home / CACHE_DIR


def mtimes(folder):
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if "__pycache__" not in p.parts}


def test_the_bundle_is_the_packages_py_files_and_data_in_a_stable_order():
    assert "__init__.py" in BUNDLE.files and "py.typed" in BUNDLE.files
    assert "launch/__main__.py" in BUNDLE.files
    assert list(BUNDLE.files) == sorted(BUNDLE.files)
    assert not [f for f in BUNDLE.files if not f.endswith((".py", "py.typed"))]
    assert runtime_bundle().digest == BUNDLE.digest


def test_the_first_ship_uploads_the_whole_package_into_the_hashed_folder(hooks, ns_hosts):
    host = ns_hosts[0]
    shipped = ship_to(hooks[host.address], host.address, BUNDLE)
    assert (shipped.uploaded_files, shipped.installed) == (len(BUNDLE.files), True)
    assert shipped.pythonpath == f"/root/{CACHE_DIR}/{BUNDLE.name}"
    target = cache(host) / BUNDLE.name
    assert runtime_bundle(target / "ringflow").digest == BUNDLE.digest
    assert (target / MARKER).read_text().strip() == BUNDLE.digest
    assert os.listdir(cache(host)) == [BUNDLE.name]  # no temporary left


def test_a_second_ship_reuses_the_cache_without_uploading(hooks, ns_hosts, monkeypatch):
    host = ns_hosts[1]
    ship_to(hooks[host.address], host.address, BUNDLE)
    before = mtimes(cache(host))
    puts = []
    original = paramiko.SFTPClient.putfo
    monkeypatch.setattr(paramiko.SFTPClient, "putfo",
                        lambda self, *a, **k: puts.append(a[1]) or original(self, *a, **k))
    again = ship_to(hooks[host.address], host.address, BUNDLE)
    assert (again.uploaded_files, again.installed, puts) == (0, False, [])
    assert mtimes(cache(host)) == before


def test_ship_runtime_ships_to_every_host_at_once(hooks, ns_hosts):
    shipped = ship_runtime(hooks, [h.address for h in ns_hosts], BUNDLE)
    assert [s.installed for s in shipped.values()] == [True, True, True]
    for host in ns_hosts:
        assert (cache(host) / BUNDLE.name / MARKER).read_text().strip() == BUNDLE.digest


def test_two_concurrent_ships_to_one_host_leave_one_complete_copy(
        ns_hosts, ns_conns, hooks, monkeypatch):
    """Two jobs (two connections) ship at once to a host without a cache: they make its
    folders at the same moment, and both have uploaded their copy before either renames it
    into place (barriers), so the second rename finds the target."""
    host = ns_hosts[2]
    for step in ("_makedirs", "_place"):
        together = threading.Barrier(2, timeout=30)
        original = getattr(shipping._Install, step)

        def in_step(self, path, together=together, original=original):
            together.wait()
            return original(self, path)

        monkeypatch.setattr(shipping._Install, step, in_step)
    jobs = [hooks[host.address], MultiHostSSHHook(ns_conns[2], conn_timeout=5)]
    results: list = []
    threads = [threading.Thread(target=lambda hook=hook: results.append(
        ship_to(hook, host.address, BUNDLE))) for hook in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    jobs[1].close()
    assert sorted(r.installed for r in results) == [False, True]
    assert [r.uploaded_files for r in results] == [len(BUNDLE.files)] * 2
    assert os.listdir(cache(host)) == [BUNDLE.name]
    assert runtime_bundle(cache(host) / BUNDLE.name / "ringflow").digest == BUNDLE.digest


def test_a_killed_ships_half_written_temporary_is_ignored_then_swept_once_stale(
        hooks, ns_hosts):
    host = ns_hosts[0]
    stale, young = (cache(host) / f".{BUNDLE.name}.tmp-{tag}" for tag in ("dead00", "busy00"))
    for temporary in (stale, young):  # what a ship killed mid-upload leaves
        (temporary / "ringflow").mkdir(parents=True)
        (temporary / "ringflow" / "__init__.py").write_text("# half")
    hour_ago = time.time() - shipping.STALE_TMP_S - 60
    os.utime(stale, (hour_ago, hour_ago))
    shipped = ship_to(hooks[host.address], host.address, BUNDLE)
    assert shipped.installed
    assert runtime_bundle(cache(host) / BUNDLE.name / "ringflow").digest == BUNDLE.digest
    # the young one may be another ship at work: it stays
    assert sorted(os.listdir(cache(host))) == sorted([young.name, BUNDLE.name])


def test_a_cache_folder_without_its_marker_is_replaced(hooks, ns_hosts):
    host = ns_hosts[1]
    broken = cache(host) / BUNDLE.name / "ringflow"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('half a copy')\n")
    shipped = ship_to(hooks[host.address], host.address, BUNDLE)
    assert shipped.installed
    assert runtime_bundle(broken).digest == BUNDLE.digest
    assert os.listdir(cache(host)) == [BUNDLE.name]


def modes(folder):
    """(files' modes, folders' modes) of a copy, as sets (what Python compiled aside)."""
    entries = [folder, *(p for p in folder.rglob("*") if "__pycache__" not in p.parts)]
    return ({p.stat().st_mode & 0o7777 for p in entries if p.is_file()},
            {p.stat().st_mode & 0o7777 for p in entries if p.is_dir()})


def test_a_shipped_copy_is_read_only_and_its_manifest_checks_on_the_host(hooks, ns_hosts):
    host = ns_hosts[2]
    ship_to(hooks[host.address], host.address, BUNDLE)
    target = cache(host) / BUNDLE.name
    assert modes(target) == ({0o444}, {0o555})
    done = host.sh(f"cd /root/{CACHE_DIR}/{BUNDLE.name} && sha256sum -c --quiet {MANIFEST}")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert len((target / MANIFEST).read_text().splitlines()) == len(BUNDLE.files)


TAMPERED = "print('TAMPERED')\n"


def test_a_tampered_copy_in_the_cache_is_replaced_and_not_used(hooks, ns_hosts):
    """A file of the cached copy changed on the host (its mode restored, the marker left):
    the next ship sees it, says so, installs a fresh copy in its place, and the runtime
    the job imports is the shipped one."""
    host = ns_hosts[0]
    hook = hooks[host.address]
    first = ship_to(hook, host.address, BUNDLE)
    victim = cache(host) / BUNDLE.name / "ringflow" / "__init__.py"
    victim.chmod(0o644)
    victim.write_text(TAMPERED + victim.read_text())
    victim.chmod(0o444)
    again = ship_to(hook, host.address, BUNDLE)
    assert (again.installed, again.uploaded_files) == (True, len(BUNDLE.files))
    assert again.replaced.startswith("ringflow/__init__.py differs from the shipped file "
                                     "(sha256 ")
    assert again.pythonpath == first.pythonpath
    python = shipping.HostPython(host.address, "/usr/bin/python3", (3, 11, 2), "1.24.2")
    assert shipping.Prepared(python, again).describe().endswith(
        f"runtime uploaded at {again.pythonpath} (the copy there was not this runtime and was "
        f"replaced: {again.replaced})")
    assert shipping.Prepared(python, first).describe().endswith(" runtime uploaded at "
                                                                f"{first.pythonpath}")
    code, out, err = hook.run(host.address, f"PYTHONPATH={shlex.quote(again.pythonpath)} "
                              "/usr/bin/python3 -c 'import ringflow'", timeout=30)
    assert (code, out) == (0, ""), err
    assert runtime_bundle(cache(host) / BUNDLE.name / "ringflow").digest == BUNDLE.digest
    assert os.listdir(cache(host)) == [BUNDLE.name]  # the tampered copy removed
    assert modes(cache(host) / BUNDLE.name) == ({0o444}, {0o555})


def test_an_added_file_or_a_writable_mode_is_not_the_shipped_copy(hooks, ns_hosts):
    host = ns_hosts[1]
    hook = hooks[host.address]
    ship_to(hook, host.address, BUNDLE)
    package = cache(host) / BUNDLE.name / "ringflow"
    package.chmod(0o755)
    (package / "sitecustomize.py").write_text(TAMPERED)
    assert ship_to(hook, host.address, BUNDLE).replaced == (
        "ringflow has mode 755, not 555; ringflow/sitecustomize.py was added")
    assert not (package / "sitecustomize.py").exists()


def test_compiled_files_python_wrote_into_the_copy_are_removed_and_the_copy_reused(
        hooks, ns_hosts):
    """The hosts' login is root, which writes __pycache__ despite the read-only folders;
    a compiled file is not checked against the manifest, so none outlives a check."""
    host = ns_hosts[1]
    hook = hooks[host.address]
    path = ship_to(hook, host.address, BUNDLE).pythonpath
    hook.run(host.address, f"PYTHONPATH={shlex.quote(path)} /usr/bin/python3 -c "
             "'import ringflow.launch.jobdir'", timeout=30)
    caches = lambda: list((cache(host) / BUNDLE.name).rglob("__pycache__"))  # noqa: E731
    assert caches()
    folders = lambda: {p: p.stat().st_mode for p in (cache(host) / BUNDLE.name).rglob("*")  # noqa: E731
                       if p.is_dir() and "__pycache__" not in p.parts}
    before = folders()
    again = ship_to(hook, host.address, BUNDLE)
    assert (again.installed, again.replaced, caches()) == (False, "", [])
    # the check leaves every folder read-only (a moment's change in between, which another
    # job's check would see, is not observable from here: the check no longer makes any)
    assert folders() == before and all(m & 0o777 == 0o555 for m in before.values())


def test_a_host_whose_sshd_offers_no_sftp_fails_the_ship_naming_it(netns_host):
    """The host's sshd has no sftp subsystem configured."""
    netns_host.reconfigure_sshd(lambda text: "".join(
        line for line in text.splitlines(keepends=True) if not line.startswith("Subsystem")))
    hook = MultiHostSSHHook(NETNS_CONN_ID, conn_timeout=5)
    try:
        wait_until(lambda: hook.run(netns_host.address, "true", timeout=5)[0] == 0, 10,
                   "sshd to answer again")
        with pytest.raises(LaunchError) as info:
            ship_runtime(hook, [netns_host.address], BUNDLE)
    finally:
        hook.close()
    assert str(info.value).startswith(f"shipping the runtime failed: host "
                                      f"{netns_host.address!r}: cannot open SFTP: SSHException")


def test_an_sftp_server_that_never_answers_fails_within_the_timeout(netns_host):
    """The host's sftp subsystem is a command that never speaks the protocol."""
    netns_host.reconfigure_sshd(lambda text: text.replace("internal-sftp", "/bin/sleep 60"))
    hook = MultiHostSSHHook(NETNS_CONN_ID, conn_timeout=5)
    try:
        wait_until(lambda: hook.run(netns_host.address, "true", timeout=5)[0] == 0, 10,
                   "sshd to answer again")
        started = time.monotonic()
        with pytest.raises(LaunchError) as info:
            hook.open_sftp(netns_host.address, timeout=1)
        elapsed = time.monotonic() - started
    finally:
        hook.close()
    assert str(info.value) == (f"host {netns_host.address!r}: cannot open SFTP: no answer "
                               "within 1 s")
    assert elapsed < 1 + 2


def test_preflight_finds_debians_python3_and_numpy_on_every_host(hooks, ns_hosts):
    found = preflight(hooks, [h.address for h in ns_hosts], "/usr/bin/python3")
    for host in ns_hosts:
        assert found[host.address].python_version[:2] == (3, 11)
        assert found[host.address].numpy_version.startswith("1.24.")


def test_a_missing_interpreter_is_a_preflight_error_naming_the_host(hooks, ns_hosts):
    with pytest.raises(LaunchError) as info:
        preflight(hooks, [ns_hosts[0].address], "/usr/bin/python9")
    assert str(info.value) == (f"preflight failed: host {ns_hosts[0].address!r}: python "
                               "'/usr/bin/python9' not found (exit 127)")


def test_every_host_without_a_usable_numpy_is_named_in_one_error(hooks, ns_hosts):
    """/root/py differs per host. On host 0 it is Debian's python3 with -S: no site
    packages, so numpy truly fails to import. On host 1 it is a stand-in: Debian 12 has no
    numpy older than 1.24 and nothing can be downloaded here, so a numpy package whose
    __version__ is 1.21.6 comes first on its path; the probe reads numpy.__version__
    exactly as it would read a real one's. Host 2's is the real thing."""
    no_numpy, old_numpy, fine = ns_hosts
    (no_numpy.home / "py").write_text('#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
    (old_numpy.home / "old" / "numpy").mkdir(parents=True)
    (old_numpy.home / "old" / "numpy" / "__init__.py").write_text('__version__ = "1.21.6"\n')
    (old_numpy.home / "py").write_text(
        '#!/bin/sh\nPYTHONPATH=/root/old exec /usr/bin/python3 "$@"\n')
    (fine.home / "py").write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    for host in ns_hosts:
        (host.home / "py").chmod(0o755)
    with pytest.raises(LaunchError) as info:
        preflight(hooks, [h.address for h in ns_hosts], "/root/py")
    assert str(info.value) == (
        f"preflight failed: host {no_numpy.address!r}: /root/py has no numpy "
        "(ModuleNotFoundError: No module named 'numpy'; pip/apt install numpy); "
        f"host {old_numpy.address!r}: /root/py has numpy 1.21.6, older than ringflow's "
        "floor 1.24")


@pytest.mark.parametrize(("out", "message"), [
    ("ringflow-probe python 3.9.18\nringflow-probe numpy 1.26.4\n",
     "host 'h': py is Python 3.9.18, older than ringflow's floor 3.10"),
    ("ringflow-probe python 3.12.1\nringflow-probe numpy 1.23.5\n",
     "host 'h': py has numpy 1.23.5, older than ringflow's floor 1.24"),
    ("", "host 'h': py could not run the probe (exit 1): Segmentation fault"),
])
def test_probe_answers_below_the_floors_are_errors_that_say_what_was_found(out, message):
    with pytest.raises(LaunchError) as info:
        read_probe("h", "py", 1 if not out else 0, out, "Segmentation fault\n")
    assert str(info.value) == message


def test_a_prerelease_numpy_above_the_floor_passes():
    found = read_probe("h", "py", 0, "ringflow-probe python 3.13.0\n"
                       "ringflow-probe numpy 2.1.0rc1\n", "")
    assert (found.python_version, found.numpy_version) == ((3, 13, 0), "2.1.0rc1")


WORKER = """import numpy, ringflow
import ringflow.distributed as dist
dist.init_parallel_env()
x = numpy.arange(5, dtype=numpy.float32) * (dist.get_rank() + 1)
dist.all_reduce(x)
print("allreduce", x.tolist(), numpy.__version__, ringflow.__file__, flush=True)
"""
SPEC = {"model": "mlp", "steps": 3, "global_batch_size": 8, "log_every": 1,
        "tensor_parallel_degree": 2, "dtype": "float64"}


def test_the_shipped_runtime_runs_on_debians_python3_and_numpy(hooks, ns_hosts):
    host = ns_hosts[0]
    hook = hooks[host.address]
    path = ship_to(hook, host.address, BUNDLE).pythonpath
    (host.home / "worker.py").write_text(WORKER)
    (host.home / "spec.json").write_text(json.dumps(SPEC))
    run = f"cd /tmp && PYTHONPATH={shlex.quote(path)} /usr/bin/python3 -m ringflow.launch"
    code, out, err = hook.run(host.address, f"{run} --nproc-per-host 2 --log-dir /tmp/ar "
                              "/root/worker.py", timeout=60)
    assert code == 0, out + err
    lines = sorted(line for line in out.splitlines() if " allreduce " in line)
    numpy_version = preflight(hook, [host.address], "/usr/bin/python3")[
        host.address].numpy_version
    assert lines == [f"[rank {r}] allreduce [0.0, 3.0, 6.0, 9.0, 12.0] {numpy_version} "
                     f"{path}/ringflow/__init__.py" for r in (0, 1)]
    code, out, err = hook.run(host.address, f"{run} --nproc-per-host 2 --log-dir /tmp/tr "
                              "-m ringflow.train /root/spec.json", timeout=120)
    assert code == 0, out + err
    assert sum(" [train] metric " in line for line in out.splitlines()) == 3
    summary = next(line for line in out.splitlines() if " [train] summary " in line)
    assert json.loads(summary.split(" [train] summary ", 1)[1])["steps"] == 3
    hook.close()
    wait_until(lambda: host.leftovers() == [], 10, "the host's sessions to end")
    assert host.shm_entries() == []
