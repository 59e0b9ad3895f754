"""The launcher's --stdin flag: secrets from stdin's first line reach every worker and nothing
else (no command line, no output); the end of stdin stops every rank; a bad first line starts
nothing; without the flag stdin is ignored. The `launcher` fixture fails any test that leaves
a process or a shm segment behind."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.launch.config import parse_launch_args
from ringflow.launch.stdin import encode_secrets, parse_secrets
from tests import procs

from .conftest import wait_for

pytestmark = pytest.mark.timeout(60)

# Records what the rank sees (secrets, its stdin), then waits for the test's "go" file.
DUMP_SECRETS = """
    import json, os, time
    rank = os.environ["PADDLE_TRAINER_ID"]
    names = ("RINGFLOW_JOB_ID", "RINGFLOW_JOB_TOKEN", "WANDB_KEY", "ODD_SECRET")
    info = {k: os.environ.get(k) for k in names}
    info["stdin"] = os.readlink("/proc/self/fd/0")
    with open(f"env.{rank}.tmp", "w") as f:
        f.write(json.dumps(info) + "\\n")
    os.rename(f"env.{rank}.tmp", f"env.{rank}.json")
    while not os.path.exists("go"):
        time.sleep(0.02)
    print("done", rank, flush=True)
"""

# Leaves a shm segment of the job (as a crashed rank would) and a child, then waits.
HOLDER = """
    import json, os, subprocess, time
    rank = os.environ["PADDLE_TRAINER_ID"]
    job = os.environ["RINGFLOW_JOB_ID"]
    open(f"/dev/shm/ringflow-{job}-held{rank}", "wb").close()
    child = subprocess.Popen(["sleep", "1000"])
    with open(f"pids.{rank}.tmp", "w") as f:
        f.write(json.dumps({"worker": os.getpid(), "child": child.pid}) + "\\n")
    os.rename(f"pids.{rank}.tmp", f"pids.{rank}")
    time.sleep(1000)
"""


def cmdlines_holding(values: list[str]) -> list[str]:
    """Every /proc/<pid>/cmdline that contains one of `values`."""
    needles = [v.encode() for v in values]
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(f"{entry.name}: {cmdline!r}")
    return found


def secrets() -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    return {"RINGFLOW_JOB_TOKEN": f"tok-{tag}-stdin", "WANDB_KEY": f"wk-{tag}",
            "ODD_SECRET": f"a b \"c\" 'd' $(id) `x` ; \\ é\nsecond-{tag}"}


# -- the protocol, without processes -------------------------------------------------------

def test_a_secrets_line_round_trips_any_string_value():
    values = secrets()
    line = encode_secrets(values)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_secrets(line[:-1]) == values
    assert parse_secrets(b"{}") == {}


def test_stdin_flag_and_its_timeout_parse_into_the_config(tmp_path):
    (tmp_path / "w.py").write_text("")
    config = parse_launch_args(["--nproc-per-host", "1", "w.py"], cwd=tmp_path)
    assert (config.stdin, config.stdin_timeout_s) == (False, 30.0)
    config = parse_launch_args(["--stdin", "--stdin-timeout", "2.5", "--nproc-per-host", "1",
                                "w.py"], cwd=tmp_path)
    assert (config.stdin, config.stdin_timeout_s) == (True, 2.5)
    with pytest.raises(ConfigError, match=r"^--stdin-timeout needs --stdin"):
        parse_launch_args(["--stdin-timeout", "1", "--nproc-per-host", "1", "w.py"],
                          cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"^--stdin-timeout must be a positive number"):
        parse_launch_args(["--stdin", "--stdin-timeout", "0", "--nproc-per-host", "1", "w.py"],
                          cwd=tmp_path)


# -- real launchers ------------------------------------------------------------------------

@pytest.mark.multiproc
def test_secrets_reach_every_worker_and_no_command_line_or_output(launcher):
    """The id comes from the launcher's environment, the token from stdin: together they
    are the job's identity, as if both had been exported."""
    launcher.script("dump.py", DUMP_SECRETS)
    values = secrets()
    env = launcher.env(identity=False, RINGFLOW_JOB_ID=launcher.job_id)
    proc = launcher.start("--stdin", "--nproc-per-host", "2", "dump.py", env=env,
                          stdin=subprocess.PIPE)
    proc.stdin.write(encode_secrets(values))
    proc.stdin.flush()
    envs = [launcher.read_json(f"env.{r}.json") for r in (0, 1)]
    leaked = cmdlines_holding(list(values.values()))  # while every process of the job lives
    (launcher.dir / "go").touch()
    proc.wait(timeout=30)  # stdin stays open until the job has ended by itself
    done = launcher.finish(proc)
    assert done.returncode == 0, done.stdout + done.stderr
    for info in envs:
        assert {k: info[k] for k in values} == values
        assert info["RINGFLOW_JOB_ID"] == launcher.job_id
        assert info["stdin"] == "/dev/null"
    assert leaked == []
    output = done.stdout + done.stderr + "".join(
        p.read_text() for p in (launcher.dir / "log").iterdir())
    for value in values.values():
        assert value not in output and value.split("\n")[-1] not in output
    assert done.result["job_id"] == launcher.job_id
    assert sorted(done.lines("[rank ")) == ["0] done 0", "1] done 1"]


@pytest.mark.multiproc
def test_the_end_of_stdin_stops_every_rank_and_removes_the_jobs_segments(launcher):
    launcher.script("holder.py", HOLDER)
    proc = launcher.start("--stdin", "--nproc-per-host", "3", "holder.py",
                          stdin=subprocess.PIPE)
    proc.stdin.write(b"{}\n")
    proc.stdin.flush()
    pids = []
    for rank in range(3):
        info = launcher.read_json(f"pids.{rank}")
        pids += [info["worker"], info["child"]]
    segments = sorted(f"ringflow-{launcher.job_id}-held{r}" for r in range(3))
    assert all(Path("/dev/shm", name).exists() for name in segments)
    closed = time.monotonic()
    proc.stdin.close()  # what the kernel does when the process that started it dies
    proc.wait(timeout=20)
    stopped_s = time.monotonic() - closed
    done = launcher.finish(proc)
    assert done.returncode == 129, done.stdout + done.stderr
    # The ranks end on SIGTERM at once; SIGKILL would come after the 5 s grace.
    assert stopped_s < 5.0 + 3.0, f"took {stopped_s:.1f} s"
    assert procs.alive(pids) == []
    assert done.lines("[launch] stdin") == [
        " closed: whoever started this launcher with --stdin is gone; stopping all ranks"]
    result = done.result
    assert (result["status"], result["exit_code"], result["failed_rank"]) == ("stopped", 129,
                                                                              None)
    assert result["cause"] == "stdin closed: whoever started this launcher with --stdin is gone"
    assert sorted(result["shm_removed"]) == segments
    assert [r["signal"] for r in result["ranks"]] == ["SIGTERM"] * 3
    assert not any(Path("/dev/shm", name).exists() for name in segments)


@pytest.mark.multiproc
@pytest.mark.parametrize("stdin", ["closed pipe", "/dev/null"])
def test_without_the_flag_stdin_is_ignored(launcher, stdin):
    launcher.script("dump.py", DUMP_SECRETS)
    (launcher.dir / "go").touch()
    source = subprocess.DEVNULL if stdin == "/dev/null" else subprocess.PIPE
    proc = launcher.start("--nproc-per-host", "2", "dump.py", stdin=source)
    if proc.stdin is not None:  # a secrets line nobody may read, then the end of input
        proc.stdin.write(encode_secrets({"WANDB_KEY": "not-for-workers"}))
        proc.stdin.close()
    envs = [launcher.read_json(f"env.{r}.json") for r in (0, 1)]
    done = launcher.finish(proc)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [info["WANDB_KEY"] for info in envs] == [None, None]
    assert [info["stdin"] for info in envs] == ["/dev/null", "/dev/null"]
    assert done.result["status"] == "succeeded"
    assert not any("stdin" in line for line in done.lines("[launch] "))


SECRET = "s3cr3t-VALUE"
BAD_LINES = {
    "not json": (f'{{"WANDB_KEY": {SECRET}}}\n'.encode(),
                 "the secrets line is not valid JSON at character 14 (Expecting value)"),
    "an array": (f'["{SECRET}"]\n'.encode(), "the secrets line is a JSON array; expected"),
    "a list value": (f'{{"WANDB_KEY": ["{SECRET}"]}}\n'.encode(),
                     "WANDB_KEY in the secrets line is a JSON array; expected a string"),
    "a bad name": (f'{{"OK": "1", "{SECRET}": "x"}}\n'.encode(),
                   "key 2 of 2 in the secrets line is not an environment variable name"),
    "a NUL": (f'{{"WANDB_KEY": "{SECRET}\\u0000"}}\n'.encode(),
              "the value of WANDB_KEY holds a NUL character"),
    "not utf-8": (f'{{"K": "{SECRET}'.encode() + b'\xff"}\n',
                  "the secrets line is not UTF-8 (byte 19)"),
    "no newline": (f'{{"K": "{SECRET}"}}'.encode(),
                   "stdin ended after 21 bytes without a newline"),
    "no input": (b"", "stdin ended before any input"),
}


@pytest.mark.multiproc
@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_first_line_exits_2_naming_the_problem_without_the_value(launcher, case):
    data, problem = BAD_LINES[case]
    launcher.script("w.py", "open('started', 'w').close()\n")
    proc = launcher.start("--stdin", "--nproc-per-host", "1", "w.py", stdin=subprocess.PIPE)
    proc.stdin.write(data)
    proc.stdin.close()
    done = launcher.finish(proc)
    assert done.returncode == 2
    assert done.stderr.startswith(f"python -m ringflow.launch: error: --stdin: {problem}")
    assert done.stderr.count("\n") == 1 and SECRET not in done.stderr
    assert done.stdout == ""
    assert not (launcher.dir / "started").exists() and not (launcher.dir / "log").exists()


@pytest.mark.multiproc
@pytest.mark.parametrize(("written", "got"), [(b"", "nothing"),
                                              (b'{"K": "s3cr3t', "13 bytes without a newline")])
def test_no_first_line_within_the_timeout_exits_2_and_starts_nothing(launcher, written, got):
    launcher.script("w.py", "open('started', 'w').close()\n")
    proc = launcher.start("--stdin", "--stdin-timeout", "0.3", "--nproc-per-host", "1", "w.py",
                          stdin=subprocess.PIPE)
    proc.stdin.write(written)
    proc.stdin.flush()
    wait_for(lambda: proc.poll() is not None, 10, "the launcher to give up")
    done = launcher.finish(proc)
    assert done.returncode == 2
    assert done.stderr.startswith("python -m ringflow.launch: error: --stdin: no secrets line "
                                  f"on stdin within 0.3 s (got {got}); expected one line of "
                                  "JSON object text")
    assert "s3cr3t" not in done.stderr and done.stdout == ""
    assert not (launcher.dir / "started").exists()


def test_bad_line_cases_keep_the_value_out_of_every_message():
    """The same parser, without processes: the message never quotes what came."""
    for data, problem in BAD_LINES.values():
        if not data.endswith(b"\n"):
            continue
        with pytest.raises(ConfigError) as info:
            parse_secrets(data[:-1])
        assert problem in str(info.value) and SECRET not in str(info.value)
        assert json.dumps(SECRET)[1:-1] not in str(info.value)
