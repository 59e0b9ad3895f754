"""Shared-memory segments are ours or refused: names nobody without the token can compute,
created 0600 and never through a symlink, another user's file or a live process's segment
named in the error and left alone (also by the launcher's sweep), a crashed incarnation's
segment reclaimed. Runs as root (make test does), to hand files to another user."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ringflow.distributed.collective.rendezvous import JobKey
from ringflow.distributed.collective.transport import shm
from ringflow.errors import CommError
from ringflow.launch.shm import sweep_job_segments

NOBODY = 65534
SLOT = 4096


@pytest.fixture
def job_id():
    job = "t" + uuid.uuid4().hex[:12]
    yield job
    for path in Path(shm.SHM_DIR).glob(f"ringflow-{job}-*"):
        path.unlink()


def _name(job_id: str, pos: int = 0) -> str:
    return shm.segment_name(job_id, 0, "0123456789abcdef", pos)


def test_segment_names_are_keyed_by_the_job_token():
    a = JobKey("job1", "token-a").tag(b"shm", "0", "127.0.0.1:1", "127.0.0.1:2")
    again = JobKey("job1", "token-a").tag(b"shm", "0", "127.0.0.1:1", "127.0.0.1:2")
    other_token = JobKey("job1", "token-b").tag(b"shm", "0", "127.0.0.1:1", "127.0.0.1:2")
    other_group = JobKey("job1", "token-a").tag(b"shm", "0", "127.0.0.1:3", "127.0.0.1:4")
    assert a == again and len(a) == 16
    assert len({a, other_token, other_group}) == 3


def test_a_created_segment_is_a_0600_file_of_this_user_with_our_pid(job_id):
    old = os.umask(0)
    try:
        seg = shm.create_segment(_name(job_id), SLOT)
    finally:
        os.umask(old)
    st = os.stat(os.path.join(shm.SHM_DIR, _name(job_id)))
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, os.getuid())
    assert shm.creator_pid(os.path.join(shm.SHM_DIR, _name(job_id))) == os.getpid()
    seg.close()
    shm.unlink(_name(job_id))


def test_another_users_file_under_the_name_is_refused_naming_the_owner(job_id):
    path = Path(shm.SHM_DIR, _name(job_id))
    path.write_bytes(b"theirs")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(CommError, match=f"held by user .* \\(uid {NOBODY}\\)"):
        shm.create_segment(_name(job_id), SLOT)
    with pytest.raises(CommError, match=f"uid {NOBODY}"):
        shm.open_segment(_name(job_id), SLOT)
    assert path.read_bytes() == b"theirs"      # neither removed nor written


def test_a_symlink_under_the_name_is_never_followed(job_id, tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    link = Path(shm.SHM_DIR, _name(job_id))
    link.symlink_to(target)
    with pytest.raises(CommError, match="not this job's"):
        shm.create_segment(_name(job_id), SLOT)
    with pytest.raises(CommError, match="cannot open shared-memory segment"):
        shm.open_segment(_name(job_id), SLOT)
    assert target.read_bytes() == b"precious" and link.is_symlink()


def test_a_segment_with_another_mode_is_not_opened(job_id):
    seg = shm.create_segment(_name(job_id), SLOT)
    path = os.path.join(shm.SHM_DIR, _name(job_id))
    os.chmod(path, 0o666)
    with pytest.raises(CommError, match="expected a file of this user with mode 0600"):
        shm.open_segment(_name(job_id), SLOT)
    seg.close()
    shm.unlink(_name(job_id))


def _held_by_child(name: str) -> subprocess.Popen:
    """A live process holding a segment of ours (its pid in the header)."""
    code = (f"from ringflow.distributed.collective.transport import shm; import sys, time\n"
            f"shm.create_segment({name!r}, {SLOT}); print('ready', flush=True)\n"
            f"sys.stdin.read()\nshm.unlink({name!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_segment_of_a_live_process_is_refused_naming_it(job_id):
    proc = _held_by_child(_name(job_id))
    try:
        with pytest.raises(CommError, match=f"held by the live process {proc.pid}"):
            shm.create_segment(_name(job_id), SLOT)
        assert sweep_job_segments(job_id) == []
    finally:
        proc.communicate("", timeout=10)


def test_a_crashed_incarnations_segment_is_reclaimed(job_id):
    proc = _held_by_child(_name(job_id))
    proc.kill()            # dies without unlinking, as a crash does
    proc.wait(10)
    seg = shm.create_segment(_name(job_id), SLOT)
    assert seg.words[shm.PID] == os.getpid() and seg.words[shm.SEQ] == 0
    seg.close()
    shm.unlink(_name(job_id))


def test_the_launchers_sweep_removes_only_dead_segments_of_this_user(job_id, tmp_path):
    dead = _held_by_child(_name(job_id, 0))
    dead.kill()
    dead.wait(10)
    live = _held_by_child(_name(job_id, 1))
    theirs = Path(shm.SHM_DIR, _name(job_id, 2))
    theirs.write_bytes(b"x" * 16)
    os.chown(theirs, NOBODY, NOBODY)
    link = Path(shm.SHM_DIR, _name(job_id, 3))
    link.symlink_to(tmp_path / "anything")
    try:
        assert sweep_job_segments(job_id) == [_name(job_id, 0)]
        left = sorted(p.name for p in Path(shm.SHM_DIR).glob(f"ringflow-{job_id}-*"))
        assert left == [_name(job_id, 1), _name(job_id, 2), _name(job_id, 3)]
    finally:
        live.communicate("", timeout=10)
