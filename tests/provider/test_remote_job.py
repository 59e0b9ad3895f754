"""The launch and kill shell scripts run by a local `sh` (what sshd would run on a launch host)."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from ringflow_provider.remote_job import JobId, kill_command, launch_command, secrets_stdin


def test_a_kill_sent_before_the_job_wrote_its_pid_file_still_kills_the_job(tmp_path):
    """on_kill between preflight and the job's start: the detached killer waits for the pid
    file, then stops the job (before, nothing was killed and the job ran on)."""
    job = JobId("ringflow_test", "poprun", f"run-{uuid.uuid4().hex[:8]}", 1)
    kill = subprocess.run(["sh", "-c", kill_command(job, None, str(tmp_path))],
                          capture_output=True, text=True, timeout=10)
    assert kill.stdout == ("ringflow: no process group recorded yet; it is killed if one "
                           "appears within 30 s\n")
    argv = ["sh", "-c", "echo started; sleep 300"]
    job_proc = subprocess.Popen(["setsid", "sh", "-c", launch_command(job, argv, None,
                                                                      str(tmp_path))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = job_proc.communicate(timeout=30)
    finally:
        if job_proc.poll() is None:
            job_proc.kill()
            job_proc.communicate(timeout=10)
    assert out.splitlines()[0].startswith("ringflow-pgid=")
    assert job_proc.returncode == 143
    assert err == "ringflow: the job was ended by signal TERM (exit status 143)\n"
    assert list(tmp_path.iterdir()) == []  # pid file and task dir removed


def test_a_job_that_ends_normally_keeps_its_exit_code_and_stderr(tmp_path):
    job = JobId("ringflow_test", "poprun", f"run-{uuid.uuid4().hex[:8]}", 2)
    argv = ["sh", "-c", "echo out; echo err >&2; exit 7"]
    done = subprocess.run(["setsid", "sh", "-c", launch_command(job, argv, {"A": "x y"},
                                                                str(tmp_path))],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 7
    assert done.stdout.splitlines()[1:] == ["out"]
    assert done.stderr == "err\n"
    assert list(tmp_path.iterdir()) == []


def test_secret_values_come_from_stdin_and_sit_on_no_command_line(tmp_path):
    job = JobId("ringflow_test", "poprun", f"run-{uuid.uuid4().hex[:8]}", 1)
    values = {"DB_PASS": "p a'ss\"w $(id) `x`", "API_TOKEN": "tok-" + uuid.uuid4().hex}
    argv = ["sh", "-c", 'printf "%s|%s\\n" "$DB_PASS" "$API_TOKEN"']
    command = launch_command(job, argv, {"PLAIN": "p1"}, str(tmp_path),
                             secret_names=list(values))
    assert all(value not in command for value in values.values())
    done = subprocess.run(["setsid", "sh", "-c", command], input=secrets_stdin(
        list(values), values), capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[1:] == [f"{values['DB_PASS']}|{values['API_TOKEN']}"]


def test_a_secret_missing_from_stdin_ends_the_launch_before_the_job(tmp_path):
    job = JobId("ringflow_test", "poprun", f"run-{uuid.uuid4().hex[:8]}", 1)
    command = launch_command(job, ["sh", "-c", "echo started"], None, str(tmp_path),
                             secret_names=["A_SECRET", "B_SECRET"])
    done = subprocess.run(["setsid", "sh", "-c", command], input="only-one\n",
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (96, "")
    assert done.stderr == "ringflow: the value of B_SECRET did not arrive on stdin\n"
    assert list(tmp_path.iterdir()) == []                    # no pid file, no task dir


def test_a_secret_that_cannot_pass_as_one_line_is_refused_without_its_value():
    with pytest.raises(ValueError) as err:
        secrets_stdin(["A_SECRET"], {"A_SECRET": "two\nlines-9f3"})
    assert "A_SECRET" in str(err.value) and "lines-9f3" not in str(err.value)
