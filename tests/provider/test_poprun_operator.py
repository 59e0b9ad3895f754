"""PopRunOperator.execute / on_kill against a real sshd running the stand-in poprun.

These call `execute()` in-process with a minimal context (the task instance's ids) to reach
the SSH behaviour quickly; test_airflow_cli.py runs the operator through real Airflow.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowHostUnreachableException,
    RingflowJobFailedException,
    RingflowJobKilledException,
    RingflowLaunchException,
)
from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.poprun import FIELD_NAMES, build_poprun_argv, parse_config
from tests.provider import task_process
from tests.provider.conftest import BAD_KEY_CONN_ID, wait_until
from tests.provider.contexts import TaskInstanceStub

pytestmark = [pytest.mark.ssh]


def write_script(sshd, body: str) -> str:
    path = sshd.work_dir / f"train_{uuid.uuid4().hex[:8]}.py"
    path.write_text("import os, sys, time, signal\n" + textwrap.dedent(body))
    return str(path)


def make_op(sshd, ssh_conn, script, **overrides):
    args = dict(task_id="poprun", hosts="127.0.0.1", nproc_per_host=1, ipus_per_replica=1,
                num_ipus=1, ipu_partition="pod16", vipu_server="vipu.test",
                training_script=script, ssh_conn_id=ssh_conn, conn_timeout=5,
                remote_state_dir=str(sshd.state_dir))
    args.update(overrides)
    op = PopRunOperator(**args)
    lines: list[tuple[str, str]] = []
    show = op._show

    def recording(line):  # what reached the operator, in order, before logging
        lines.append((line.stream, line.text))
        show(line)

    op._show = recording
    op._cached_logger = RecordingLog()
    return op, lines


class RecordingLog:
    """Stands in for the operator's logger: keeps (level, message) in order, and the
    structured fields of each record (keyword arguments, as Airflow's structlog takes them)
    in `fields`, one dict per record."""

    def __init__(self):
        self.records: list[tuple[str, str]] = []
        self.fields: list[dict] = []

    def _add(self, level, msg, *args, **fields):
        self.records.append((level, msg % args if args else msg))
        self.fields.append(fields)

    def info(self, msg, *args, **fields):
        self._add("info", msg, *args, **fields)

    def warning(self, msg, *args, **fields):
        self._add("warning", msg, *args, **fields)

    def error(self, msg, *args, **fields):
        self._add("error", msg, *args, **fields)


def context(run_id=None, try_number=1, max_tries=0):
    return {"ti": TaskInstanceStub("ringflow_test", "poprun", run_id, try_number, max_tries)}


def processes_running(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,pgid,stat,args"], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return [line for line in out.splitlines() if marker in line and " Z" not in line]


def run_in_thread(op, ctx):
    outcome: dict = {}

    def target():
        try:
            outcome["result"] = op.execute(ctx)
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    return worker, outcome


def test_remote_poprun_receives_exactly_the_built_argv(sshd, ssh_conn):
    script = write_script(sshd, """
        print("env", os.environ["PADDLE_TRAINER_ID"], os.environ["PADDLE_RANK_IN_NODE"],
              os.environ["PADDLE_CURRENT_ENDPOINT"], os.environ["RUN_NAME"], flush=True)
    """)
    pwned = sshd.work_dir / "pwned"
    hostile = ["a b", f"$(touch {pwned})", "it's", "*", "`id`; echo x", "|&;<>"]
    fields = dict(hosts="127.0.0.1, localhost", nproc_per_host=2, num_ipus=4,
                  training_script_args=hostile, extra_env={"RUN_NAME": "e:/x@1%2+=~^,-"})
    op, lines = make_op(sshd, ssh_conn, script, **fields)
    result = op.execute(context())
    cfg = parse_config({name: getattr(op, name) for name in FIELD_NAMES})
    argv = build_poprun_argv(cfg)
    received = next(line for _, line in lines if line.startswith("standin-poprun argv="))
    assert json.loads(received.split("=", 1)[1]) == argv[1:]
    envs = [json.loads(line.split("env=", 1)[1]) for _, line in lines
            if line.startswith("standin-poprun instance=")]
    assert [(e["PADDLE_TRAINER_ID"], e["PADDLE_RANK_IN_NODE"], e["PADDLE_CURRENT_ENDPOINT"])
            for e in envs] == [("0", "0", "127.0.0.1:8090"), ("1", "1", "127.0.0.1:8090"),
                               ("2", "0", "localhost:8090"), ("3", "1", "localhost:8090")]
    assert sorted(line for _, line in lines if line.startswith("env ")) == [
        "env 0 0 127.0.0.1:8090 e:/x@1%2+=~^,-", "env 1 1 127.0.0.1:8090 e:/x@1%2+=~^,-",
        "env 2 0 localhost:8090 e:/x@1%2+=~^,-", "env 3 1 localhost:8090 e:/x@1%2+=~^,-"]
    assert not pwned.exists()
    assert result["argv"] == argv
    assert set(result) == {"argv", "num_instances", "num_replicas", "launch_host", "exit_code",
                           "duration_s", "dry_run"}
    json.dumps(result)  # XCom takes it as JSON
    assert (result["num_instances"], result["num_replicas"], result["exit_code"]) == (4, 4, 0)
    assert result["launch_host"] == "127.0.0.1"
    assert result["duration_s"] > 0
    (job_dir,) = [Path(p.job_dir) for p in op._handle.parts]  # kept, with how the job ended
    status = json.loads((job_dir / "status.json").read_text())
    assert (status["state"], status["exit_code"], status["stopped_by"]) == ("ended", 0, None)
    assert b"standin-poprun argv=" in (job_dir / "output.log").read_bytes()
    assert processes_running(script) == []


def test_secret_env_values_are_masked_in_streamed_lines_and_xcom(sshd, ssh_conn):
    script = write_script(sshd, 'v = os.environ["API_TOKEN"]\n'
                                'print("token is", v, "reversed", v[::-1], flush=True)\n')
    op, lines = make_op(sshd, ssh_conn, script, extra_env={"API_TOKEN": "tok-8c1e55"})
    result = op.execute(context())
    # the job itself gets the real value; what it prints of it is masked on the host already
    assert ("stdout", "token is *** reversed 55e1c8-kot") in lines
    assert "tok-8c1e55" not in json.dumps(result)
    assert any(a.endswith("-x API_TOKEN") for a in result["argv"])   # bare: value over stdin


# Runs in every instance while the job runs: digests of the values it got, and how many
# command lines on this host (the launch host: sshd's session, the launch shells, poprun,
# the instances) hold one of them.
SECRET_PROBE = """
    import hashlib
    names = ["API_TOKEN", "DB_PASS", "RINGFLOW_JOB_TOKEN"]
    values = [os.environ.get(n, "") for n in names]
    found = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            continue
        found += any(v and v.encode() in line for v in values)
    digests = [hashlib.sha256(v.encode()).hexdigest()[:16] if v else "-" for v in values]
    print("probe", os.environ["PADDLE_TRAINER_ID"], *digests, "job", os.environ.get(
          "RINGFLOW_JOB_ID", "-"), "on command lines:", found, flush=True)
"""


def _digest(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_secret_values_reach_the_instances_and_no_command_line(sshd, ssh_conn):
    token_value, password = "tok-" + uuid.uuid4().hex, "p a'ss\"w $(id) " + uuid.uuid4().hex
    script = write_script(sshd, SECRET_PROBE)
    op, lines = make_op(sshd, ssh_conn, script, hosts="127.0.0.1", nproc_per_host=2,
                        num_ipus=2, extra_env={"API_TOKEN": token_value, "RUN": "plain-1"},
                        secret_env={"DB_PASS": password}, ringflow_job=True)
    result = op.execute(context())
    probes = sorted(line.split() for _, line in lines if line.startswith("probe "))
    assert len(probes) == 2
    job_ids = {p[6] for p in probes}
    assert len(job_ids) == 1 and re.fullmatch(r"[0-9a-f]{12}", job_ids.pop())
    tokens = {p[4] for p in probes}
    assert len(tokens) == 1 and tokens != {"-"}                # one token, in every instance
    for probe in probes:
        assert probe[2:4] == [_digest(token_value), _digest(password)]
        assert probe[-1] == "0"                               # on no command line
    local = next(a for a in result["argv"] if a.startswith("--mpi-local-args="))
    assert local.endswith("-x API_TOKEN -x RUN=plain-1 -x DB_PASS -x RINGFLOW_JOB_TOKEN "
                          f"-x RINGFLOW_JOB_ID={probes[0][6]}")
    text = json.dumps(result) + json.dumps(lines) + json.dumps(op._cached_logger.records)
    assert token_value not in text and password not in text


# An instance that leaves a shared-memory segment of its job behind, as a crashed rank does
# (an empty file: no live creator in its header).
SEGMENT_LEAVER = """
    job, rank = os.environ["RINGFLOW_JOB_ID"], os.environ["PADDLE_TRAINER_ID"]
    open(f"/dev/shm/ringflow-{job}-held{rank}", "wb").close()
    print("left", job, rank, flush=True)
    if len(sys.argv) > 1:
        time.sleep(300)
"""


def _left_segments(lines) -> list[Path]:
    left = [line.split() for _, line in lines if line.startswith("left ")]
    return [Path(f"/dev/shm/ringflow-{job}-held{rank}") for _, job, rank in left]


def test_a_ringflow_job_leaves_no_shm_segment_on_any_host(sshd, ssh_conn):
    script = write_script(sshd, SEGMENT_LEAVER)
    op, lines = make_op(sshd, ssh_conn, script, hosts="127.0.0.1,localhost", num_ipus=2,
                        ringflow_job=True, python=sys.executable)
    op.execute(context())
    segments = _left_segments(lines)
    assert len(segments) == 2 and not any(p.exists() for p in segments)
    said = [m for _, m in op._cached_logger.records if m.startswith("shm sweep on ")]
    assert sorted(m.split(":")[0] for m in said) == ["shm sweep on 127.0.0.1",
                                                     "shm sweep on localhost"]
    # the launch host's supervisor removed them as the job ended (both "hosts" are this
    # machine here), or the sweep of every host after it
    (part,) = op._handle.parts
    by_supervisor = json.loads((Path(part.job_dir) / "status.json").read_text())["shm_removed"]
    by_sweep = [n for m in said if "removed" in m for n in m.split("removed shm segments ")[1]
                .split()]
    assert sorted(by_supervisor + by_sweep) == sorted(p.name for p in segments)


@pytest.mark.slow
def test_a_killed_ringflow_job_leaves_no_shm_segment(sshd, ssh_conn):
    script = write_script(sshd, SEGMENT_LEAVER)
    op, lines = make_op(sshd, ssh_conn, script, ringflow_job=True, python=sys.executable,
                        training_script_args=["hold"])
    worker, outcome = run_in_thread(op, context())
    wait_until(lambda: _left_segments(lines), 30, "the instance to leave its segment")
    started = time.monotonic()
    op.on_kill()
    assert time.monotonic() - started < 2.0
    worker.join(20)
    assert "was killed" in str(outcome["error"])
    (segment,) = _left_segments(lines)
    wait_until(lambda: not segment.exists(), 20, "the delayed sweep to remove the segment")


def test_nonzero_exit_fails_with_the_code_and_the_last_20_lines(sshd, ssh_conn):
    script = write_script(sshd, """
        for i in range(1, 31):
            print(f"line {i}", flush=True)
        sys.exit(3)
    """)
    op, _ = make_op(sshd, ssh_conn, script)
    with pytest.raises(RingflowJobFailedException) as info:
        op.execute(context())
    assert (info.value.exit_code, info.value.host) == (3, "127.0.0.1")
    assert not isinstance(info.value, AirflowFailException)    # a retry may help
    message = str(info.value)
    assert message.startswith("PopRun failed on '127.0.0.1' with exit code 3; last 20 lines:\n")
    assert message.splitlines()[1:] == [f"line {i}" for i in range(11, 31)]


@pytest.mark.parametrize("skip", [42, [41, 42]])
def test_exit_code_listed_in_skip_on_exit_code_skips_the_task(sshd, ssh_conn, skip):
    script = write_script(sshd, "sys.exit(42)\n")
    op, _ = make_op(sshd, ssh_conn, script, skip_on_exit_code=skip)
    with pytest.raises(AirflowSkipException, match=r"PopRun exited with 42 on '127\.0\.0\.1'"):
        op.execute(context())


def test_preflight_failure_names_the_host_before_anything_starts(sshd, ssh_conn):
    script = write_script(sshd, "print('must not run')\n")
    op, lines = make_op(sshd, ssh_conn, script, poprun="poprun-not-installed")
    with pytest.raises(RingflowLaunchException, match=r"preflight failed: 'poprun-not-installed' "
                                                      r"not found on launch host '127\.0\.0\.1'") \
            as info:
        op.execute(context())
    assert not isinstance(info.value, RingflowHostUnreachableException)
    assert lines == []


def test_a_key_the_server_refuses_fails_preflight_naming_the_host(sshd, ssh_conn):
    op, lines = make_op(sshd, BAD_KEY_CONN_ID, "train.py", hosts="127.0.0.1,localhost",
                        num_ipus=2)
    with pytest.raises(RingflowHostUnreachableException) as info:
        op.execute(context())
    message = str(info.value)
    assert message.startswith("preflight failed: cannot open SSH to host '127.0.0.1'")
    assert "cannot open SSH to host 'localhost'" in message
    assert message.count("AuthenticationException") == 2
    assert lines == []


def test_dry_run_renders_and_validates_without_ssh(sshd):
    op, lines = make_op(sshd, "no_such_connection", "train.py", dry_run=True, num_ipus=8,
                        hosts="n1,n2", nproc_per_host=2)
    result = op.execute(context())
    assert result["exit_code"] is None and result["dry_run"] is True
    assert result["argv"][1:3] == ["--num-instances=4", "--num-replicas=8"]
    assert lines == []


@pytest.mark.slow
def test_on_kill_kills_the_remote_group_returns_at_once_and_fails_execute(sshd, ssh_conn):
    # The instance ignores SIGTERM, so only the SIGKILL sent 5 s later can end it.
    script = write_script(sshd, """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(300)
    """)
    op, lines = make_op(sshd, ssh_conn, script)
    worker, outcome = run_in_thread(op, context())
    try:
        wait_until(lambda: ("stdout", "ready") in lines, 30, "the job to start")
        assert op._pgid is not None
        started = time.monotonic()
        op.on_kill()
        on_kill_s = time.monotonic() - started
        # checked before anything else can take time: the SIGKILL comes 5 s after the TERM
        still_running = processes_running(script)
        worker.join(10)
        assert not worker.is_alive()
        assert still_running, "on_kill waited for the SIGKILL"
        wait_until(lambda: not processes_running(script), 20, "the remote group to die")
    finally:
        op.on_kill()
    assert on_kill_s < 2.0, f"on_kill took {on_kill_s:.2f} s"
    assert isinstance(outcome.get("error"), RingflowJobKilledException)
    assert "was killed (on_kill)" in str(outcome["error"])


def first_try_killed(sshd, ssh_conn, script, run_id, wait_for):
    """Try 1 in a task process of its own (a retry may follow: max_tries 1), SIGKILLed
    once its job printed `wait_for`: as a worker that dies mid-job."""
    args = dict(task_id="poprun", hosts="127.0.0.1", nproc_per_host=1, ipus_per_replica=1,
                num_ipus=1, ipu_partition="pod16", vipu_server="vipu.test",
                training_script=script, ssh_conn_id=ssh_conn, conn_timeout=5,
                remote_state_dir=str(sshd.state_dir))
    task_process.killed(sshd.work_dir, PopRunOperator, args, "ringflow_test", run_id, wait_for)


def test_a_retry_attaches_to_the_job_the_earlier_try_left_running(sshd, ssh_conn):
    go_on = sshd.work_dir / f"go-{uuid.uuid4().hex[:6]}"
    script = write_script(sshd, f"""
        print("ready", flush=True)
        while not os.path.exists({str(go_on)!r}):
            time.sleep(0.05)
        print("finished after the retry attached", flush=True)
    """)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    first_try_killed(sshd, ssh_conn, script, run_id, "ready")
    time.sleep(1)
    assert processes_running(script), "the job did not outlive the task process of try 1"
    second, lines = make_op(sshd, ssh_conn, script)
    worker, outcome = run_in_thread(second, context(run_id, try_number=2))
    wait_until(lambda: any("try 2: attaching to the running job of try 1" in m
                           for _, m in second._cached_logger.records), 30, "the attach")
    go_on.touch()
    worker.join(30)
    assert outcome["result"]["exit_code"] == 0, outcome
    assert ("stdout", "finished after the retry attached") in lines
    assert not any(line == "ready" for _, line in lines)  # try 1's lines are in try 1's log
    assert processes_running(script) == []


def test_a_restarting_retry_first_stops_what_the_earlier_try_left_running(sshd, ssh_conn):
    go_quick = sshd.work_dir / f"quick-{uuid.uuid4().hex[:6]}"
    script = write_script(sshd, f"""
        if os.path.exists({str(go_quick)!r}):
            print("second try done", flush=True)
            sys.exit(0)
        print("ready", flush=True)
        time.sleep(300)
    """)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    first_try_killed(sshd, ssh_conn, script, run_id, "ready")
    assert processes_running(script)
    go_quick.touch()
    second, second_lines = make_op(sshd, ssh_conn, script, on_existing="restart")
    result = second.execute(context(run_id, try_number=2))
    assert result["exit_code"] == 0
    assert ("stdout", "second try done") in second_lines
    assert any(re.fullmatch(r"host 127\.0\.0\.1: try 1's job was still running: asked the "
                            r"supervisor \(pid \d+\) to stop the job: try 2 starts the job "
                            r"again", m) for _, m in second._cached_logger.records)
    assert processes_running(script) == []


def test_a_stale_job_folder_never_kills_an_unrelated_process(sshd, ssh_conn):
    """An earlier try's folder whose supervisor is gone and whose recorded process group now
    belongs to someone else: nothing is signalled, the new try runs."""
    from ringflow_provider.launchers.job import JobHandle, Part, TaskKey

    unrelated = subprocess.Popen(["setsid", "sleep", "60"])
    try:
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        task = TaskKey("ringflow_test", "poprun", run_id, 1)
        folder = sshd.state_dir / task.key / "try-1"
        folder.mkdir(parents=True)
        handle = JobHandle("ssh", "stale", task, ("127.0.0.1",),
                           (Part("127.0.0.1", str(folder), ssh_conn),), "python3")
        (folder / "handle.json").write_text(json.dumps(handle.to_dict()))
        (folder / "status.json").write_text(json.dumps({
            "state": "running", "pid": unrelated.pid, "pgid": unrelated.pid,
            "supervisor_pid": unrelated.pid, "marker": "not-this-one"}))
        (folder / "output.log").write_text("")
        script = write_script(sshd, 'print("second try ran", flush=True)\n')
        op, lines = make_op(sshd, ssh_conn, script)
        assert op.execute(context(run_id, try_number=2))["exit_code"] == 0
        assert ("stdout", "second try ran") in lines
        assert not any("still running" in m for _, m in op._cached_logger.records)
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait(10)


def test_execution_timeout_path_kills_the_remote_group(sshd, ssh_conn):
    """Airflow's execution_timeout: SIGALRM raises inside execute, then the runner calls
    on_kill (task_runner._run_execute_callable); the SSH client is already closed by then.
    (A retry may follow, so the job is not tied to the task's connection: on_kill stops it.)"""
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout

    script = write_script(sshd, 'print("ready", flush=True)\ntime.sleep(300)\n')
    op, lines = make_op(sshd, ssh_conn, script)
    with pytest.raises(AirflowTaskTimeout), timeout(3):
        op.execute(context(max_tries=1))
    assert ("stdout", "ready") in lines
    assert processes_running(script)
    op.on_kill()
    wait_until(lambda: not processes_running(script), 20, "the remote group to die")



def test_the_job_runs_in_its_own_session_with_stdin_from_dev_null(sshd, ssh_conn):
    script = write_script(sshd, """
        print("ids", os.getpgrp(), os.getsid(0), os.readlink("/proc/self/fd/0"), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
    """)
    op, lines = make_op(sshd, ssh_conn, script)
    op.execute(context())
    ids = next(line for _, line in lines if line.startswith("ids ")).split()
    assert ids[1:] == [str(op._pgid), str(op._pgid), "/dev/null"]
    records = op._cached_logger.records
    assert any(level == "info" and re.fullmatch(
        rf"job \w+ started on 127\.0\.0\.1 under ringflow's supervisor \(pid \d+\) as process "
        rf"group {op._pgid}, folder {sshd.state_dir}/\w+/try-1", message)
        for level, message in records)
    assert ("warning", "to stderr") in records
    assert ("info", " ".join(ids)) in records


def test_the_plan_and_the_command_are_logged_before_the_job_starts(sshd, ssh_conn):
    script = write_script(sshd, 'print("started", flush=True)\n')
    op, _ = make_op(sshd, ssh_conn, script, hosts="127.0.0.1,localhost", num_ipus=4,
                    nproc_per_host=2, extra_env={"DB_PASSWORD": "pw-4471"})
    op.execute(context())
    messages = [message for _, message in op._cached_logger.records]
    plan = messages.index("PopRun job: 4 instance(s) (2 per host on 2 hosts: "
                          "127.0.0.1,localhost), 4 replica(s) of 1 IPU(s), partition 'pod16' "
                          "on V-IPU server 'vipu.test'")
    command = messages[plan + 1]
    assert command.startswith("PopRun command on 127.0.0.1:\npoprun \\\n    --num-instances=4")
    assert "-x DB_PASSWORD'" in command and "pw-4471" not in command  # a bare -x
    preflight = messages.index(f"preflight passed: SSH to 127.0.0.1, localhost works "
                               f"(connection {ssh_conn!r}); poprun on 127.0.0.1 is "
                               f"{sshd.bin_dir}/poprun")
    assert plan + 1 < preflight < messages.index("started")
    assert messages[-1].startswith(f"PopRun job {op._handle.task} on 127.0.0.1 succeeded after ")


def test_launch_host_other_than_the_first_host_runs_poprun(sshd, ssh_conn):
    script = write_script(sshd, 'print("ran", flush=True)\n')
    op, lines = make_op(sshd, ssh_conn, script, hosts="127.0.0.1,localhost", num_ipus=2,
                        launch_host="localhost", preflight=False)
    result = op.execute(context())
    assert result["launch_host"] == "localhost"
    assert set(op._launcher.runtimes) == {"localhost"}  # the only host prepared
    assert ("stdout", "ran") in lines


def test_a_job_ended_by_a_signal_reports_128_plus_n_and_the_signal(sshd, ssh_conn):
    script = write_script(sshd, """
        print("ending my process group", flush=True)
        os.killpg(0, signal.SIGTERM)
        time.sleep(30)
    """)
    op, lines = make_op(sshd, ssh_conn, script)
    with pytest.raises(AirflowException) as info:
        op.execute(context())
    assert str(info.value).startswith(
        "PopRun failed on '127.0.0.1' with exit code 143 (128+15: SIGTERM)")
    assert op._pgid is not None
    # nothing but the job's own output: no "Terminated" from a shell
    assert [line for _, line in lines if not line.startswith("standin-poprun ")] == [
        "ending my process group"]
    (part,) = op._handle.parts
    status = json.loads((Path(part.job_dir) / "status.json").read_text())
    assert status["cause"] == "poprun was killed by SIGTERM (exit code 143)"


def test_invalid_rendered_arguments_fail_without_retry_and_mask_secrets(sshd):
    op, _ = make_op(sshd, "no_such_connection", "t.py", dry_run=True,
                    extra_env="{{ params.env }}")
    op.render_template_fields({"params": {"env": '{"API_TOKEN": "tok\\n9141"}'}})
    with pytest.raises(RingflowConfigException) as info:
        op.execute(context())
    assert isinstance(info.value, AirflowFailException)
    assert str(info.value) == ("invalid PopRun configuration: extra_env: extra_env API_TOKEN: "
                               "the value holds a line break or NUL")
    with pytest.raises(AirflowException) as info:   # a value that quotes a secret in a slot
        make_op(sshd, "c", "t.py", extra_env={"MY_SECRET": "sec-ret-77", "RUN": "x sec-ret-77"})
    assert "sec-ret-77" not in str(info.value) and "RUN='x ***'" in str(info.value)
    op, _ = make_op(sshd, "c", "t.py", dry_run=True, launch_host="{{ params.h }}")
    op.render_template_fields({"params": {"h": "user@n1"}})
    with pytest.raises(AirflowFailException, match=r"^launch_host: host 'user@n1' is not a "):
        op.execute(context())


def test_cmd_timeout_fails_the_task_and_stops_the_remote_job(sshd, ssh_conn):
    """Airflow calls no on_kill after an exception, so execute stops what it started."""
    script = write_script(sshd, 'print("ready", flush=True)\ntime.sleep(300)\n')
    op, lines = make_op(sshd, ssh_conn, script, cmd_timeout=1)
    with pytest.raises(RingflowLaunchException) as info:   # the host answers: not unreachable
        op.execute(context())
    assert not isinstance(info.value, RingflowHostUnreachableException)
    assert ("stdout", "ready") in lines
    assert str(info.value).startswith(
        "host '127.0.0.1': no output for 1 s (cmd_timeout); on '127.0.0.1': ")
    wait_until(lambda: not processes_running(script), 20, "the remote group to die")
