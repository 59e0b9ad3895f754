"""The launch and kill shell scripts run by a local `sh` (what sshd would run on a launch host)."""

from __future__ import annotations

import subprocess
import uuid

from ringflow_provider.remote_job import JobId, kill_command, launch_command


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
