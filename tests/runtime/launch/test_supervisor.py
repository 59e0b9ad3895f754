"""The supervisor of detached jobs (`python -m ringflow.launch.supervisor`) with real
processes: output and status in the job folder, secrets that stay secret, the lease, stop,
follow (and its tie), and what happens when the supervisor itself is SIGKILLed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringflow.launch import jobdir
from ringflow.launch.exits import LOST_EXIT
from ringflow.launch.follow import FINAL_PREFIX
from ringflow.launch.supervisor import STARTED_PREFIX
from tests import procs

pytestmark = pytest.mark.multiproc

SUPERVISOR = [sys.executable, "-m", "ringflow.launch.supervisor"]
# prints its env var SECRET's presence, N lines 0.05 s apart, then exits with CODE
COUNTER = """import os, sys, time
print("has secret:", "SECRET" in os.environ, flush=True)
for i in range(int(sys.argv[1])):
    print(f"line {i}", flush=True)
    time.sleep(0.05)
sys.exit(int(sys.argv[2]))
"""
SECRET = "s3cr3t-value-Zx81"


def start(job_dir: Path, *command: str, options: tuple[str, ...] = (),
          stdin: str | None = None) -> dict:
    """`run --detach`; returns what its started line says."""
    out = subprocess.run([*SUPERVISOR, "run", "--job-dir", str(job_dir), "--detach", *options,
                          "--", *command], input=(stdin or "").encode(), capture_output=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr.decode()
    line = out.stdout.decode().strip()
    assert line.startswith(STARTED_PREFIX), line
    return json.loads(line[len(STARTED_PREFIX):])


def counter(lines: int, code: int = 0) -> list[str]:
    return [sys.executable, "-c", COUNTER, str(lines), str(code)]


def wait_ended(job_dir: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = jobdir.read_status(job_dir)
        if status and status["state"] == jobdir.ENDED and not jobdir.supervisor_alive(job_dir):
            return status
        time.sleep(0.05)
    raise AssertionError(f"job in {job_dir} did not end within {timeout} s: "
                         f"{jobdir.read_status(job_dir)}")


def follow(job_dir: Path, *options: str, timeout: float = 30,
           stdin: int | None = subprocess.DEVNULL) -> tuple[int, bytes, dict | None]:
    out = subprocess.run([*SUPERVISOR, "follow", "--job-dir", str(job_dir), *options],
                         stdin=stdin, capture_output=True, timeout=timeout)
    final = [line for line in out.stderr.decode().splitlines()
             if line.startswith(FINAL_PREFIX)]
    return out.returncode, out.stdout, (json.loads(final[-1][len(FINAL_PREFIX):])
                                        if final else None)


def alive(pid: int) -> bool:
    return bool(procs.alive([pid]))


def test_a_detached_job_writes_its_output_and_status_and_follow_ends_with_its_code(tmp_path):
    job = tmp_path / "job"
    said = start(job, *counter(20, 3))
    assert said["pid"] == said["pgid"] and said["supervisor_pid"] != os.getpid()
    code, out, final = follow(job, "--renew")
    assert code == 3
    assert out.decode().splitlines() == ["has secret: False", *(f"line {i}" for i in range(20))]
    assert final["state"] == "ended" and final["exit_code"] == 3 and final["offset"] == len(out)
    status = wait_ended(job, 10)
    assert status["cause"] == "python ended with exit code 3" and status["program"] == "python"
    assert status["started_at"] <= status["ended_at"] and status["stopped_by"] is None
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    for name in (jobdir.OUTPUT, jobdir.STATUS, jobdir.LEASE, jobdir.LOCK):
        assert stat.S_IMODE((job / name).stat().st_mode) == 0o600, name


def test_a_secret_the_job_prints_is_masked_in_its_output_log(tmp_path):
    job = tmp_path / "job"
    start(job, sys.executable, "-c", "import os; print('it is', os.environ['SECRET'], 'ok')",
          options=("--secrets", "env"), stdin=json.dumps({"SECRET": SECRET}) + "\n")
    code, out, _ = follow(job)
    assert code == 0 and out == b"it is *** ok\n"
    assert SECRET.encode() not in (job / jobdir.OUTPUT).read_bytes()


def test_a_url_password_is_masked_and_the_rest_of_the_url_stays_readable(tmp_path):
    """ringflow.secrets: a URL under a plain name hides its password only; under a secret
    name (or in the mask list) all of it; a password the job prints alone is hidden too."""
    url, dsn = "postgres://app:pw-Url-771@db:5432/prod", "mysql://u:pw-Dsn-882@h/x"
    job = tmp_path / "job"
    start(job, sys.executable, "-c", "import os; e = os.environ; print(e['DATABASE_URL']); "
          "print(e['DB_DSN']); print('alone', 'pw-Url-771', 'pw-Dsn-882')",
          options=("--secrets", "env"),
          stdin=json.dumps({"ringflow:env": {"DATABASE_URL": url, "DB_DSN": dsn},
                            "ringflow:mask": []}) + "\n")
    code, out, _ = follow(job)
    assert code == 0
    assert out.decode().splitlines() == ["postgres://app:***@db:5432/prod", "***",
                                         "alone *** ***"]


def test_secrets_reach_the_command_and_no_file_or_command_line(tmp_path):
    job = tmp_path / "job"
    said = start(job, sys.executable, "-c", "import os, time; print('has', os.environ['SECRET']"
                 "[::-1], flush=True); time.sleep(1.5)",
                 options=("--secrets", "env"), stdin=json.dumps({"SECRET": SECRET}) + "\n")
    cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in (said["pid"],
                                                                   said["supervisor_pid"])]
    assert all(SECRET.encode() not in c for c in cmdlines)
    code, out, _ = follow(job)
    assert code == 0 and out.decode() == f"has {SECRET[::-1]}\n"
    for path in job.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name


def test_stdin_secrets_are_the_commands_first_stdin_line_and_its_stdin_stays_open(tmp_path):
    job = tmp_path / "job"
    reader = ("import sys, json, select; line = sys.stdin.readline(); "
              "print(sorted(json.loads(line)), flush=True); "
              "r, _, _ = select.select([sys.stdin], [], [], 1.0); "
              "print('still open' if not r else 'ended', flush=True)")
    start(job, sys.executable, "-c", reader, options=("--secrets", "stdin"),
          stdin=json.dumps({"SECRET": SECRET, "RINGFLOW_JOB_TOKEN": "t" * 64}) + "\n")
    code, out, _ = follow(job)
    assert code == 0
    assert out.decode().splitlines() == ["['RINGFLOW_JOB_TOKEN', 'SECRET']", "still open"]


def test_a_job_whose_lease_is_not_renewed_stops_itself_and_leaves_nothing(tmp_path):
    job = tmp_path / "job"
    said = start(job, *counter(10_000), options=("--lease-timeout", "1.5", "--grace", "2"))
    started = time.monotonic()
    status = wait_ended(job, 15)
    assert 1.5 <= time.monotonic() - started < 6
    assert status["stopped_by"] == "lease" and "not renewed for 1.5 s" in status["cause"]
    assert status["exit_code"] == 128 + signal.SIGTERM
    assert not alive(said["pid"]) and not procs.marked_processes(
        "RINGFLOW_SUPERVISED", status["marker"])


def test_following_with_renew_keeps_the_lease_fresh(tmp_path):
    job = tmp_path / "job"
    start(job, *counter(60), options=("--lease-timeout", "1"))  # 60 x 0.05 s = 3 s > 1 s
    code, out, final = follow(job, "--renew")
    assert code == 0 and final["stopped_by"] is None
    assert out.decode().splitlines()[-1] == "line 59"


def test_stop_terms_then_kills_the_job_and_every_process_that_carries_its_marker(tmp_path):
    job = tmp_path / "job"
    # ignores SIGTERM and leaves a grandchild in a session of its own (escaped the group)
    stubborn = ("import os, signal, subprocess, sys, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
                "start_new_session=True); print('child', p.pid, flush=True); time.sleep(60)")
    said = start(job, sys.executable, "-c", stubborn, options=("--grace", "1"))
    deadline = time.monotonic() + 10
    while b"child" not in (job / jobdir.OUTPUT).read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int((job / jobdir.OUTPUT).read_text().split()[1])
    out = subprocess.run([*SUPERVISOR, "stop", "--job-dir", str(job), "--why",
                          "marked failed by a user", "--wait", "10"],
                         capture_output=True, text=True, timeout=30)
    assert f"asked the supervisor (pid {said['supervisor_pid']})" in out.stdout
    status = wait_ended(job, 5)
    assert status["stopped_by"] == "request" and status["cause"] == "marked failed by a user"
    assert status["exit_code"] == 128 + signal.SIGKILL
    assert not alive(said["pid"]) and not alive(grandchild)


def test_when_the_supervisor_is_sigkilled_the_job_stops_and_follow_says_lost(tmp_path):
    job = tmp_path / "job"
    said = start(job, *counter(10_000))
    os.kill(said["supervisor_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(said["pid"]):
        assert time.monotonic() < deadline, "the command outlived its supervisor"
        time.sleep(0.05)
    code, out, final = follow(job)
    assert code == LOST_EXIT and final["state"] == jobdir.LOST
    assert out.startswith(b"has secret: False\nline 0\n")


def test_follow_tie_stops_the_job_when_the_watcher_goes(tmp_path):
    job = tmp_path / "job"
    start(job, *counter(10_000))
    watcher = subprocess.Popen([*SUPERVISOR, "follow", "--job-dir", str(job), "--tie"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert watcher.stdout.readline() == b"has secret: False\n"
    watcher.stdin.close()  # the watcher's side is gone
    assert watcher.wait(timeout=10) == 0
    watcher.stdout.close()
    status = wait_ended(job, 15)
    assert status["stopped_by"] == "request" and "watcher" in status["cause"]


def test_follow_tie_stops_the_job_when_the_watcher_stops_reading_its_output(tmp_path):
    """The watcher gone while the job prints: follow's next write breaks the pipe before it
    looks at stdin (which stays open here), and a tied job is stopped all the same."""
    job = tmp_path / "job"
    start(job, *counter(10_000))
    watcher = subprocess.Popen([*SUPERVISOR, "follow", "--job-dir", str(job), "--tie"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert watcher.stdout.readline() == b"has secret: False\n"
    watcher.stdout.close()  # the watcher's reading end is gone; its stdin is not
    assert watcher.wait(timeout=10) == 0
    watcher.stdin.close()
    status = wait_ended(job, 15)
    assert status["stopped_by"] == "request" and "watcher" in status["cause"]


def test_follow_without_tie_leaves_the_job_running_when_the_watcher_goes(tmp_path):
    job = tmp_path / "job"
    said = start(job, *counter(10_000))
    watcher = subprocess.Popen([*SUPERVISOR, "follow", "--job-dir", str(job)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert watcher.stdout.readline() == b"has secret: False\n"
    watcher.stdin.close()
    assert watcher.wait(timeout=10) == 0
    watcher.stdout.close()
    time.sleep(0.5)
    assert alive(said["pid"])
    subprocess.run([*SUPERVISOR, "stop", "--job-dir", str(job), "--wait", "10"], timeout=30,
                   check=True, capture_output=True)
    assert wait_ended(job, 5)["stopped_by"] == "request"


def test_follow_from_an_offset_and_a_last_line_without_newline_is_ended(tmp_path):
    job = tmp_path / "job"
    start(job, sys.executable, "-c", "import sys; sys.stdout.write('one\\ntwo\\nthree')")
    wait_ended(job, 10)
    code, out, final = follow(job, "--offset", "4")
    assert code == 0 and out == b"two\nthree\n" and final["offset"] == len(b"one\ntwo\nthree\n")


def test_run_refuses_a_folder_that_holds_a_job_and_a_command_that_cannot_start(tmp_path):
    job = tmp_path / "job"
    start(job, *counter(1))
    wait_ended(job, 10)
    again = subprocess.run([*SUPERVISOR, "run", "--job-dir", str(job), "--detach", "--", "true"],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "holds a job already" in again.stderr
    missing = subprocess.run([*SUPERVISOR, "run", "--job-dir", str(tmp_path / "other"),
                              "--detach", "--", "/nonexistent/program"],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1 and "cannot start '/nonexistent/program'" in missing.stderr


def test_the_shell_peek_and_renew_read_what_the_local_peek_reads(tmp_path):
    job = tmp_path / "job"
    start(job, *counter(5))
    wait_ended(job, 10)
    subprocess.run(jobdir.renew_command(str(job), 17), shell=True, check=True, timeout=10)
    remote = jobdir.parse_peek(subprocess.run(jobdir.peek_command(str(job), 3, 25), shell=True,
                                              capture_output=True, timeout=10).stdout)
    local = jobdir.peek(job, 3, 25)
    assert remote == dataclasses.replace(local, lease_age=remote.lease_age)
    assert abs(remote.lease_age - local.lease_age) <= 1  # whole seconds, read apart
    assert remote.shown == 17 and remote.state == "ended" and not remote.alive
    assert remote.data == b" secret: False\nline 0\n"  # from byte 3, whole lines of 25 bytes
