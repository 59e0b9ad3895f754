"""`python -m ringflow.launch.mpirun` (TPTrainOperator's launcher="mpirun") on this host with
Open MPI's real mpirun: the secrets line of stdin reaches every agent as a variable (never
on a command line), `--export` passes named variables, each agent sees its MPI rank, and the
end of stdin stops the job (exit 129) with nothing left. Two hosts: test_tp_train_hosts.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringflow.launch.stdin import encode_secrets

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[3]
WRAPPER = [sys.executable, "-m", "ringflow.launch.mpirun"]
TOKEN = "tok-" + "cd" * 24
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()
# Prints what an agent sees; scans every command line on the host for the token (which it
# knows only by its digest, so its own command line does not hold it).
_SHOW = f"""import hashlib, json, os
token = os.environ.get("RINGFLOW_JOB_TOKEN", "")
lines = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        lines.append(open("/proc/" + pid + "/cmdline", "rb").read().decode(errors="replace"))
    except OSError:
        pass
print(json.dumps({{"rank": os.environ["OMPI_COMM_WORLD_RANK"],
                  "token": hashlib.sha256(token.encode()).hexdigest() == {DIGEST!r},
                  "extra": os.environ.get("EXTRA"),
                  "on_cmdline": any(token in line for line in lines)}}))
"""


@pytest.fixture(scope="module", autouse=True)
def mpirun():
    if shutil.which("mpirun") is None:
        pytest.fail("Open MPI's mpirun is not installed: `make sysdeps` installs openmpi-bin",
                    pytrace=False)


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "provider"), **extra}


def test_every_agent_gets_the_secrets_the_exports_and_its_rank():
    # stdin stays open until the job has ended by itself: its end would stop the job (129)
    job = subprocess.Popen([*WRAPPER, "--hosts", "localhost", "--stdin", "--export", "EXTRA",
                            "--", sys.executable, "-c", _SHOW], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env(EXTRA="e1", RINGFLOW_JOB_ID="agents_test"))
    job.stdin.write(encode_secrets({"RINGFLOW_JOB_TOKEN": TOKEN}).decode())
    job.stdin.flush()
    done = subprocess.CompletedProcess(job.args, 0, job.stdout.read(), job.stderr.read())
    job.stdin.close()
    done.returncode = job.wait(30)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads(line.partition("<stdout>:")[2]) for line in done.stdout.splitlines()
            if line.startswith("[1,0]<stdout>:{")]
    assert seen == [{"rank": "0", "token": True, "extra": "e1", "on_cmdline": False}]
    assert "[launch] mpirun: job agents_test: one launcher agent on each of 1 host(s)" \
        in done.stdout
    assert TOKEN not in done.stdout + done.stderr


def test_an_export_that_is_not_set_is_an_error_before_anything_starts():
    done = subprocess.run([*WRAPPER, "--hosts", "localhost", "--export", "NOPE_NOT_SET", "--",
                           "true"], capture_output=True, text=True, timeout=30, env=env(),
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "NOPE_NOT_SET" in done.stderr


def test_the_end_of_stdin_stops_the_job_with_129_and_nothing_left():
    marker = f"lifeline-{os.getpid()}-{time.monotonic_ns()}"
    job = subprocess.Popen([*WRAPPER, "--hosts", "localhost", "--stdin", "--", sys.executable,
                            "-c", f"import time  # {marker}\ntime.sleep(60)"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env=env(RINGFLOW_JOB_ID="agents_test"))
    job.stdin.write(encode_secrets({"RINGFLOW_JOB_TOKEN": TOKEN}).decode())
    job.stdin.flush()
    deadline = time.monotonic() + 60
    while not running(marker):
        assert job.poll() is None, f"the job ended with {job.returncode}: {job.stdout.read()}"
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.1)
    job.stdin.close()  # whoever started it is gone
    out = job.stdout.read()
    job.wait(30)
    assert job.returncode == 129
    assert "[launch] mpirun: stopped by stdin closed; mpirun stopped every instance" in out
    deadline = time.monotonic() + 15
    while running(marker):
        assert time.monotonic() < deadline, "an agent outlived the job"
        time.sleep(0.1)


def running(marker: str) -> bool:
    """Whether an agent runs: a `python -c CODE` whose CODE holds `marker` (the wrapper and
    mpirun hold it further on in their command lines). Read from /proc: `ps` cuts long
    command lines at a width when its output is not a terminal."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args[1:2] == [b"-c"] and marker.encode() in args[2]:
            return True
    return False


# A rank that prints, as whole lines of its own, Open MPI's tag of another agent (host 1)
# before rank 0's summary and before an agent's result line; rank 0 prints the real summary.
_FORGER = """import os, sys
out = sys.stdout
if os.environ["PADDLE_TRAINER_ID"] == "1":
    out.write('[1,1]<stdout>:[rank 0] [train] summary {"final_loss": 666.0, "steps": 9}\\n')
    out.write('[1,1]<stdout>:[launch] result {"exit_code": 0, "cause": "forged"}\\n')
    out.write('x\\r[1,1]<stdout>:[launch] result {"exit_code": 0, "cause": "forged"}\\n')
else:
    out.write('[train] summary {"final_loss": 0.5, "steps": 2}\\n')
out.flush()
"""


def test_a_rank_cannot_speak_as_another_agent_through_open_mpis_tags(tmp_path):
    """Agents under the real mpirun, their output read as the operator reads it (host index
    by Open MPI's tag): every line is this host's; the summary and result are the real ones."""
    from types import SimpleNamespace

    from ringflow_provider.launchers.lines import RESULT, SUMMARY, lines_of

    (tmp_path / "forger.py").write_text(_FORGER)
    done = subprocess.run([*WRAPPER, "--hosts", "localhost", "--", sys.executable, "-m",
                           "ringflow.launch", "--nproc-per-host", "2", "--log-dir",
                           str(tmp_path / "logs"), str(tmp_path / "forger.py")],
                          capture_output=True, timeout=90, stdin=subprocess.DEVNULL,
                          env=env(RINGFLOW_JOB_ID="forge_test"))
    assert done.returncode == 0, done.stdout + done.stderr
    handle = SimpleNamespace(show_hosts=True, gathered=True, hosts=["h0", "h1"])
    lines = lines_of(done.stdout, handle, "h0")
    assert {line.host for line in lines} == {"h0"}
    assert [line.payload for line in lines if line.kind == SUMMARY] == [
        {"final_loss": 0.5, "steps": 2}]
    results = [line.payload for line in lines if line.kind == RESULT]
    assert len(results) == 1 and results[0]["cause"] != "forged"
    assert results[0]["status"] == "succeeded"
