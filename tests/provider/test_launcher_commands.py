"""The shell text of supervised jobs (`launchers.commands`) run by a local `sh`, as sshd runs
it on a host: secrets over stdin only, a try started twice, old job folders forgotten."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringflow.launch import jobdir
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.commands import Runtime

RUNTIME = Runtime(sys.executable)
SECRET = "p a'ss\"w $(id) `x` 7c1d"


def start(job_dir: Path, argv: list[str], stdin: str, *, secrets: str = "env",
          env: dict | None = None, names: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    command = commands.start_command(RUNTIME, str(job_dir), argv, env=env or {},
                                     secrets=secrets, lease_timeout=None, grace_s=2,
                                     handle={"job_id": "j1"}, secret_names=names)
    home = job_dir.parents[2]  # tmp_path: the jobs folder is <home>/jobs/<task>/try-N
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                          timeout=30, env={**os.environ, "HOME": str(home)})


def wait_ended(job_dir: Path) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = jobdir.read_status(job_dir)
        if status and status["state"] == "ended" and not jobdir.supervisor_alive(job_dir):
            return status
        time.sleep(0.05)
    raise AssertionError(f"no end: {jobdir.read_status(job_dir)}")


def test_secrets_come_over_stdin_and_sit_on_no_command_line(tmp_path):
    job = tmp_path / "jobs" / "key" / "try-1"
    # the value's digest (the value itself would be masked in output.log)
    argv = ["sh", "-c", 'printf "%s|%s\\n" "$(printf %s "$DB_PASS" | sha256sum | cut -c1-16)" '
                        '"$PLAIN"']
    command = commands.start_command(RUNTIME, str(job), argv, env={"PLAIN": "p 1"},
                                     secrets="env", lease_timeout=None, grace_s=2, handle={})
    assert SECRET not in command
    done = start(job, argv, json.dumps({"DB_PASS": SECRET}) + "\n", env={"PLAIN": "p 1"},
                 names=("DB_PASS",))
    assert done.returncode == 0, done.stderr
    assert wait_ended(job)["exit_code"] == 0
    digest = hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    assert (job / "output.log").read_text() == f"{digest}|p 1\n"
    assert json.loads((job / "handle.json").read_text()) == {"job_id": "j1"}


def test_a_secret_the_host_has_is_replaced_by_the_one_sent(tmp_path):
    """A variable of a secret's name in the login's environment is unset first: only the
    value sent over stdin reaches the job."""
    job = tmp_path / "jobs" / "key" / "try-1"
    argv = ["sh", "-c", 'echo "${API_TOKEN:-unset}"']
    command = commands.start_command(RUNTIME, str(job), argv, env={}, secrets="stdin",
                                     lease_timeout=None, grace_s=2, handle={},
                                     secret_names=["API_TOKEN"])
    done = subprocess.run(["sh", "-c", command], input='{"API_TOKEN": "sent-9a1"}\n',
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "API_TOKEN": "host-value"})
    assert done.returncode == 0, done.stderr
    wait_ended(job)
    assert (job / "output.log").read_text() == "unset\n"  # stdin mode: the command reads it


def test_a_start_whose_secrets_never_come_starts_nothing(tmp_path):
    job = tmp_path / "jobs" / "key" / "try-1"
    done = start(job, ["sh", "-c", "echo started"], stdin="")
    assert done.returncode == 2
    assert "--stdin: stdin ended before any input" in done.stderr
    assert not (job / "output.log").exists()


def test_a_try_started_again_keeps_the_ended_job_aside_and_refuses_a_running_one(tmp_path):
    job = tmp_path / "jobs" / "key" / "try-1"
    assert start(job, ["sh", "-c", "echo first"], "{}\n").returncode == 0
    wait_ended(job)
    assert start(job, ["sh", "-c", "echo second; sleep 30"], "{}\n").returncode == 0
    kept = [p for p in job.parent.iterdir() if p.name.startswith("try-1.replaced-")]
    assert len(kept) == 1 and (kept[0] / "output.log").read_text() == "first\n"
    again = start(job, ["sh", "-c", "echo third"], "{}\n")
    assert again.returncode == commands.RUNNING_EXIT
    assert again.stderr.strip() == f"{commands.RUNNING_MESSAGE} {job}"
    subprocess.run(["sh", "-c", commands.stop_command(RUNTIME, str(job), "test over", 10)],
                   check=True, timeout=30, capture_output=True)
    assert wait_ended(job)["cause"] == "test over"


def test_folders_of_jobs_that_ended_long_ago_are_forgotten_at_the_next_start(tmp_path):
    old = tmp_path / "jobs" / "other" / "try-3"
    old.mkdir(parents=True)
    (old / "output.log").write_text("old\n")
    week = time.time() - (commands.KEEP_DAYS + 1) * 86400
    os.utime(old, (week, week))
    recent = tmp_path / "jobs" / "other" / "try-4"
    recent.mkdir()
    job = tmp_path / "jobs" / "key" / "try-1"
    assert start(job, ["true"], "{}\n").returncode == 0
    wait_ended(job)
    assert not old.exists() and recent.exists()


@pytest.mark.parametrize("value", ["x; rm -rf /", "$(id)", "a'b", "`id`", "\n", "-m os"])
def test_no_value_can_add_a_command(tmp_path, value):
    job = tmp_path / "jobs" / "key" / "try-1"
    argv = ["printf", "%s|", value]
    done = start(job, argv, "{}\n", env={"X": value})
    assert done.returncode == 0, done.stderr
    wait_ended(job)
    assert (job / "output.log").read_text() == f"{value}|\n"
