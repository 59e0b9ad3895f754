"""ringflow-poprun, the CPU poprun (issue 11): its command line is what `build_poprun_argv`
produces (unknown flags named, IPU-only flags ignored), the mpirun command it becomes, the
reassembly of Open MPI's tagged output, and real jobs under Open MPI's mpirun on this host:
per-instance env, POPDIST_* variables, the job token off every command line, the first
failing instance's exit code and name, SIGTERM and SIGKILL leaving no instance behind.

Multi-host runs are in tests/provider/test_cpu_poprun_hosts.py (namespace hosts)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.launch.lines import Line
from ringflow.launch.openmpi import (
    EXIT_LINE,
    EXIT_NONCE_VAR,
    INSTANCE_SH,
    RANK_EXIT_LINE,
    OutputJoiner,
)
from ringflow.poprun import PopRunJob, mpirun_argv, parse_poprun_args
from ringflow.poprun.args import HelpRequested
from ringflow_provider.poprun import build_poprun_argv, parse_config
from tests.runtime.distributed.spawn import free_ports

REPO = Path(__file__).resolve().parents[2]
POPRUN = [sys.executable, "-m", "ringflow.poprun"]
# one job identity per test process: the token is the marker a job's watchdog stops processes
# by, and the id names its shared memory, so two test processes (pytest-xdist) must not share
# them
JOB_ID = f"poprun_test_{os.getpid()}"
JOB_ENV = {"RINGFLOW_JOB_ID": JOB_ID, "RINGFLOW_JOB_TOKEN": "t0k3n-" + uuid.uuid4().hex}
SEED_FIELDS = dict(hosts="h1,h2", nproc_per_host=2, ipus_per_replica=2, num_ipus=16,
                   ipu_partition="pod16", vipu_server="10.0.0.9", training_script="train.py",
                   training_script_args=["--lr", "0.1"], endpoint_port=8090,
                   extra_env={"A": "1"}, mpi_global_args=["--mca", "btl_tcp_if_include",
                                                          "lo"])


def seed_args(**overrides):
    """build_poprun_argv's argv (the seed's), without argv[0], parsed by ringflow-poprun."""
    argv = build_poprun_argv(parse_config({**SEED_FIELDS, **overrides}))
    return parse_poprun_args(argv[1:])


# the command line -----------------------------------------------------------------------
def test_the_seed_argv_parses_into_instances_replicas_hosts_and_program():
    args = seed_args()
    assert (args.num_instances, args.replicas, args.ipus_per_replica) == (4, 8, 2)
    assert args.hosts == ("h1", "h2") and args.per_host == 2
    assert args.program == ["python3", "train.py", "--lr", "0.1"]
    assert args.mpi_global_args == ("--mca", "btl_tcp_if_include", "lo")
    assert args.mpi_local_args == ("-x", "PADDLE_TRAINERS_NUM=4", "-x",
                                   "PADDLE_TRAINER_ENDPOINTS=h1:8090,h2:8090", "-x", "A=1")
    assert args.instance_mpi_local_args[3] == (
        "-x", "PADDLE_TRAINER_ID=3", "-x", "PADDLE_CURRENT_ENDPOINT=h2:8090",
        "-x", "PADDLE_RANK_IN_NODE=1")
    assert [args.host_of(i) for i in range(4)] == ["h1", "h1", "h2", "h2"]


def test_ipu_only_flags_are_accepted_and_listed_as_ignored():
    args = seed_args()
    assert args.ignored == ("--ipus-per-replica=2", "--vipu-partition=pod16",
                            "--vipu-server-host=10.0.0.9", "--update-partition=no",
                            "--vipu-server-timeout=120", "--numa-aware=yes")


def test_an_unknown_flag_is_an_error_naming_it():
    with pytest.raises(ConfigError, match="unknown option '--num-ipus'"):
        parse_poprun_args(["--num-ipus=4", "python3", "t.py"])


def test_space_separated_values_short_host_flag_and_bare_booleans():
    args = parse_poprun_args(["--num-instances", "2", "-H", "a,b", "--print-topology",
                              "--offline-mode", "no", "-v", "prog", "--print-topology"])
    assert (args.num_instances, args.hosts, args.print_topology) == (2, ("a", "b"), True)
    assert args.ignored == ("--offline-mode=no",) and args.verbose == 1
    assert args.program == ["prog", "--print-topology"]  # the program's own flags stay its


def test_a_double_dash_ends_the_options():
    assert parse_poprun_args(["--", "-weird-program", "x"]).program == ["-weird-program", "x"]


@pytest.mark.parametrize("argv, message", [
    (["--num-instances=3", "--host=a,b", "p"], "cannot be divided evenly among 2 hosts"),
    (["--num-instances=2", "--num-replicas=3", "p"], "must be a positive multiple"),
    (["--num-instances=2", "--instance-mpi-local-args=2:-x A=1", "p"], "names instance 2"),
    (["--instance-mpi-local-args=0:-x A=1", "--instance-mpi-local-args=0:-x B=1", "p"],
     "instance 0 is given twice"),
    (["--instance-mpi-local-args=-x A=1", "p"], "expected INDEX:"),
    (["--num-instances=two", "p"], "expected a whole number"),
    (["--print-topology=maybe", "p"], "expected yes or no"),
    (["--host=a,,b", "p"], "empty host name"),
    (["--host=a,a", "p"], "names a host twice"),
    (["--only-output-from-instance=1", "p"], "there are 1 instances"),
    (["--mpi-local-args"], "needs a value"),
    (["--mpi-global-args=--tag-output", "--mpi-global-args=--mca plm_rsh_agent x", "p"],
     "--mpi-global-args is given twice; give each option once"),
    (["--mpi-local-args=-x A=1", "--mpi-local-args", "-x B=2", "p"],
     "--mpi-local-args is given twice"),
    (["--host=a", "-H", "b", "p"], "--host/-H is given twice"),
    (["--num-instances=1", "--num-instances=2", "p"], "--num-instances is given twice"),
    (["--num-instances=2"], "no program to run"),
])
def test_bad_command_lines_are_errors_saying_why(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_poprun_args(argv)


def test_help_is_asked_for_not_an_error():
    with pytest.raises(HelpRequested):
        parse_poprun_args(["--help"])


# the mpirun command ---------------------------------------------------------------------
def contexts(argv: list[str]) -> list[list[str]]:
    """mpirun's MPMD app contexts (split on ':'), after its global options."""
    start = argv.index("-np")
    out, current = [], []
    for token in argv[start:]:
        if token == ":":
            out.append(current)
            current = []
        else:
            current.append(token)
    return [*out, current]


def exports(context: list[str]) -> dict[str, str | None]:
    return {item.partition("=")[0]: (item.partition("=")[2] if "=" in item else None)
            for flag, item in itertools.pairwise(context) if flag == "-x"}


def test_one_app_context_per_instance_on_its_host_with_its_env():
    args = seed_args()
    argv = mpirun_argv(args, {"PATH": "/usr/bin", **JOB_ENV}, as_root=False)
    assert argv[:6] == ["mpirun", "--tag-output", "--bind-to", "none", "--mca",
                        "btl_tcp_if_include"]
    ctxs = contexts(argv)
    assert [c[:4] for c in ctxs] == [["-np", "1", "-H", f"{h}:2"] for h in
                                     ("h1", "h1", "h2", "h2")]
    env = exports(ctxs[3])
    assert env["PADDLE_TRAINER_ID"] == "3" and env["PADDLE_RANK_IN_NODE"] == "1"
    assert env["A"] == "1" and env["PADDLE_TRAINER_ENDPOINTS"] == "h1:8090,h2:8090"
    assert {k: v for k, v in env.items() if k.startswith("POPDIST_")} == {
        "POPDIST_NUM_TOTAL_REPLICAS": "8", "POPDIST_NUM_IPUS_PER_REPLICA": "2",
        "POPDIST_NUM_LOCAL_REPLICAS": "2", "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "POPDIST_REPLICA_INDEX_OFFSET": "6", "POPDIST_LOCAL_INSTANCE_INDEX": "1"}
    assert env["IPUOF_VIPU_API_PARTITION_ID"] == "pod16"
    assert env["IPUOF_VIPU_API_HOST"] == "10.0.0.9"
    assert ctxs[3][-8:] == ["sh", "-c", INSTANCE_SH, "ringflow-poprun-instance", "python3",
                            "train.py", "--lr", "0.1"]


def test_the_instance_sh_reports_its_programs_exit_code_and_time_and_exits_with_it():
    """... with the job's exit nonce, which the program itself never sees."""
    done = subprocess.run(["sh", "-c", INSTANCE_SH, "x", sys.executable, "-c",
                           "import os, sys; print(os.environ.get('RINGFLOW_EXIT_NONCE')); "
                           "sys.exit(6)"], env={**os.environ, EXIT_NONCE_VAR: "n0nce"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 6 and done.stdout == "None\n"
    reported = EXIT_LINE.match(done.stderr.strip())
    assert reported and reported.group(1) == "n0nce" and reported.group(2) == "6"
    assert abs(float(reported.group(3)) - time.time()) < 60


def test_the_first_failure_by_the_instances_clocks_wins_over_mpiruns_order():
    """mpirun names instance 0 (beside it) first; instance 3 (remote) ended 40 ms earlier."""
    job = PopRunJob(parse_poprun_args(["--num-instances=4", "--host=a,b", "p"]),
                    stdout=io.StringIO(), stderr=io.StringIO())
    joined_line = job._emitter("stderr", job.stderr)

    def emit(index: int | None, text: str) -> None:  # whole lines, as OutputJoiner passes them
        joined_line(index, Line(text.replace("NONCE", job._exit_nonce), True))

    emit(0, "ringflow-poprun-exit NONCE 1 1000.050")
    emit(None, "  Process name: [[77,1],0]")
    emit(None, "  Exit code:    1")
    emit(3, "ringflow-poprun-exit NONCE 3 1000.010")
    emit(1, "ringflow-poprun-exit NONCE 0 1000.000")
    assert job._first_failure(1) == 3
    job._close_output()
    assert job.stdout.getvalue() == ("ringflow-poprun: instance 3 on b failed first with "
                                     "exit code 3; every instance was stopped\n")
    assert "ringflow-poprun-exit" not in job.stderr.getvalue()  # consumed, not shown


def test_the_token_is_exported_bare_never_as_a_value():
    argv = mpirun_argv(seed_args(), JOB_ENV, as_root=False)
    assert JOB_ENV["RINGFLOW_JOB_TOKEN"] not in " ".join(argv)
    for ctx in contexts(argv):
        env = exports(ctx)
        assert env["RINGFLOW_JOB_TOKEN"] is None and env["RINGFLOW_JOB_ID"] is None


def test_variables_the_instance_options_export_are_not_exported_twice():
    args = parse_poprun_args(["--mpi-local-args=-x RINGFLOW_JOB_ID=mine -x "
                              "POPDIST_NUM_TOTAL_REPLICAS=9", "p"])
    ctx = contexts(mpirun_argv(args, JOB_ENV, as_root=False))[0]
    names = [item.partition("=")[0] for flag, item in itertools.pairwise(ctx) if flag == "-x"]
    assert names.count("RINGFLOW_JOB_ID") == 1 and names.count("POPDIST_NUM_TOTAL_REPLICAS") == 1
    assert exports(ctx)["RINGFLOW_JOB_ID"] == "mine"


def test_root_gets_allow_run_as_root_and_others_do_not():
    args = parse_poprun_args(["p"])
    assert "--allow-run-as-root" in mpirun_argv(args, {}, as_root=True)
    assert "--allow-run-as-root" not in mpirun_argv(args, {}, as_root=False)


# output reassembly ------------------------------------------------------------------------
def joined(chunks: list[bytes]) -> list[tuple[int | None, str]]:
    lines: list[tuple[int | None, str]] = []
    joiner = OutputJoiner(lambda instance, line: lines.append((instance, line)))
    for chunk in chunks:
        joiner.feed(chunk)
    joiner.close()
    return lines


def test_fragments_of_one_line_are_joined_across_other_instances_lines():
    # as Open MPI 4.1 wrote it when instance 0 printed "partial-" and, 0.2 s later, "rest 0"
    stream = (b"[1,0]<stdout>:inst 0 start\n[1,0]<stdout>:partial-[1,1]<stdout>:inst 1 start\n"
              b"[1,1]<stdout>:partial-[1,0]<stdout>:rest 0\n[1,1]<stdout>:rest 1\n")
    expected = [(0, "inst 0 start"), (1, "inst 1 start"), (0, "partial-rest 0"),
                (1, "partial-rest 1")]
    assert joined([stream]) == expected
    assert joined([stream[i:i + 1] for i in range(len(stream))]) == expected  # byte by byte


def test_untagged_lines_are_mpiruns_own_empty_lines_included():
    assert joined([b"----\n\n  Exit code: 3\n[12,4]<stderr>:boom\n"]) == [
        (None, "----"), (None, ""), (None, "  Exit code: 3"), (4, "boom")]


def test_a_line_cut_off_by_the_end_of_the_stream_is_still_emitted():
    assert joined([b"[1,0]<stdout>:no newline", b""]) == [(0, "no newline")]
    assert joined([b"[1,0]<stdout>:half-[1,1]<stdout>:whole\n"]) == [(1, "whole"), (0, "half-")]


def wholeness(chunks: list[bytes]) -> list[tuple[int | None, str, bool]]:
    return [(index, line, line.whole) for index, line in joined(chunks)]


def test_a_line_is_whole_only_from_its_start_to_its_newline():
    """Fragments of one line, whoever's came between, make a whole line; a piece after a
    \\r, or a last line without its newline, is none."""
    assert wholeness([b"[1,0]<stdout>:a\n[1,1]<stdout>:b-[1,0]<stdout>:c-[1,1]<stdout>:\n"
                      b"[1,0]<stdout>:\n"]) == [(0, "a", True), (1, "b-", True),
                                                 (0, "c-", True)]
    assert wholeness([b"[1,2]<stdout>:10%\r100%\n[1,2]<stdout>:end"]) == [
        (2, "10%", False), (2, "100%", False), (2, "end", False)]


# real jobs under mpirun ----------------------------------------------------------------
@pytest.fixture(scope="module")
def mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        pytest.fail("Open MPI's mpirun is not installed: `make sysdeps` installs openmpi-bin",
                    pytrace=False)
    return path


def poprun(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60):
    environ = {**os.environ, "PYTHONPATH": str(REPO / "provider"), **(env or {})}
    return subprocess.run([*POPRUN, *argv], capture_output=True, text=True, timeout=timeout,
                          env=environ, stdin=subprocess.DEVNULL)


# Prints what an instance sees: its env, and whether its parent's command line (mpirun's)
# holds the token.
_SHOW_ENV = """import hashlib, json, os
token = os.environ.get("RINGFLOW_JOB_TOKEN", "")
parent = open("/proc/%d/cmdline" % os.getppid(), "rb").read().decode()
print(json.dumps({
    "rank": os.environ.get("OMPI_COMM_WORLD_RANK"),
    "popdist": {k: v for k, v in os.environ.items() if k.startswith("POPDIST_")},
    "paddle_id": os.environ.get("PADDLE_TRAINER_ID"), "a": os.environ.get("A"),
    "job_id": os.environ.get("RINGFLOW_JOB_ID"),
    "token_sha": hashlib.sha256(token.encode()).hexdigest(), "token_len": len(token),
    "token_on_parent_cmdline": bool(token) and token in parent}))
"""


def instance_json(stdout: str) -> dict[int, dict]:
    seen = {}
    for line in stdout.splitlines():
        if line.startswith("[1,") and "<stdout>:{" in line:
            tag, _, text = line.partition("<stdout>:")
            seen[int(tag[3:-1])] = json.loads(text)
    return seen


@pytest.mark.multiproc
def test_each_instance_gets_its_options_popdist_and_the_jobs_identity(mpirun):
    out = poprun(["--num-instances=2", "--num-replicas=4", "--mpi-local-args=-x A=common",
                  "--instance-mpi-local-args=0:-x PADDLE_TRAINER_ID=0",
                  "--instance-mpi-local-args=1:-x PADDLE_TRAINER_ID=1",
                  sys.executable, "-c", _SHOW_ENV], env=JOB_ENV)
    assert out.returncode == 0, out.stderr
    seen = instance_json(out.stdout)
    assert sorted(seen) == [0, 1]
    digest = hashlib.sha256(JOB_ENV["RINGFLOW_JOB_TOKEN"].encode()).hexdigest()
    for i in (0, 1):
        assert seen[i]["rank"] == str(i) and seen[i]["paddle_id"] == str(i)
        assert seen[i]["a"] == "common" and seen[i]["job_id"] == JOB_ID
        assert seen[i]["token_sha"] == digest and not seen[i]["token_on_parent_cmdline"]
        assert seen[i]["popdist"]["POPDIST_REPLICA_INDEX_OFFSET"] == str(2 * i)
        assert seen[i]["popdist"]["POPDIST_NUM_LOCAL_REPLICAS"] == "2"
    assert JOB_ENV["RINGFLOW_JOB_TOKEN"] not in out.stdout + out.stderr


@pytest.mark.multiproc
def test_without_an_identity_in_its_env_one_is_made_for_all_instances(mpirun):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_JOB")}
    out = subprocess.run([*POPRUN, "--num-instances=2", sys.executable, "-c", _SHOW_ENV],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env={**env, "PYTHONPATH": str(REPO / "provider")})
    assert out.returncode == 0, out.stderr
    seen = instance_json(out.stdout)
    assert seen[0]["job_id"] == seen[1]["job_id"] and len(seen[0]["job_id"]) == 12
    assert seen[0]["token_sha"] == seen[1]["token_sha"] and seen[0]["token_len"] == 64
    assert f"job {seen[0]['job_id']}" in out.stdout


@pytest.mark.multiproc
def test_output_is_whole_tagged_lines_and_can_be_limited_to_one_instance(mpirun):
    script = ("import sys, time, os; r = os.environ['OMPI_COMM_WORLD_RANK']\n"
              "sys.stdout.write('part-'); sys.stdout.flush(); time.sleep(0.3)\n"
              "print('whole ' + r, flush=True); print('err ' + r, file=sys.stderr)")
    out = poprun(["--num-instances=2", sys.executable, "-c", script])
    assert out.returncode == 0, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if line.startswith("[1,")) == [
        "[1,0]<stdout>:part-whole 0", "[1,1]<stdout>:part-whole 1"]
    assert sorted(line for line in out.stderr.splitlines() if line.startswith("[1,")) == [
        "[1,0]<stderr>:err 0", "[1,1]<stderr>:err 1"]
    only = poprun(["--num-instances=2", "--only-output-from-instance=1", sys.executable, "-c",
                   script])
    assert [line for line in only.stdout.splitlines() if line.startswith("[1,")] == [
        "[1,1]<stdout>:part-whole 1"]


@pytest.mark.multiproc
def test_print_topology_and_ignored_flags_are_reported(mpirun):
    out = poprun(["--num-instances=2", "--num-replicas=4", "--print-topology=yes",
                  "--vipu-partition=pod16", "true"])
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines()]
    assert ["ringflow-poprun:", "localhost", "1", "2-3"] in lines
    assert "ringflow-poprun: IPU-only options accepted and ignored: --vipu-partition=pod16" \
        in out.stdout


def marker_processes(marker: str) -> dict[int, list[str]]:
    """pid -> argv of every live process with `marker` in its argv (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(marker in arg for arg in argv):
            found[int(entry.name)] = argv
    return found


def wait_gone(marker: str, timeout: float = 15) -> dict[int, list[str]]:
    deadline = time.monotonic() + timeout
    while (left := marker_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.multiproc
def test_the_first_failing_instance_sets_the_exit_code_and_is_named(mpirun, marker):
    script = (f"import os, sys, time  # {marker}\n"
              "if os.environ['OMPI_COMM_WORLD_RANK'] == '1':\n"
              "    time.sleep(0.5); sys.exit(7)\n"
              "time.sleep(60)")
    out = poprun(["--num-instances=2", sys.executable, "-c", script])
    assert out.returncode == 7
    assert "ringflow-poprun: instance 1 on localhost failed first with exit code 7; every " \
           "instance was stopped" in out.stdout
    assert wait_gone(marker) == {}


@pytest.mark.multiproc
def test_an_instance_cannot_report_an_exit_code_for_itself_or_another(mpirun):
    """Instance 1 prints exit reports (as its own, after a \\r, behind instance 0's tag)
    naming code 9 at an early time, then fails with 5: the job's code is 5, named as its;
    the reports it printed are shown as output, never taken."""
    script = ("import os, sys, time\n"
              "if os.environ['OMPI_COMM_WORLD_RANK'] == '1':\n"
              "    for line in ('ringflow-poprun-exit x 9 1.0',\n"
              "                 'y\\rringflow-poprun-exit x 9 1.0',\n"
              "                 '[1,0]<stderr>:ringflow-poprun-exit x 9 1.0'):\n"
              "        os.write(2, line.encode() + b'\\n')\n"
              "    time.sleep(0.5); sys.exit(5)\n"
              "time.sleep(30)")
    out = poprun(["--num-instances=2", sys.executable, "-c", script])
    assert out.returncode == 5, out.stdout + out.stderr
    assert "ringflow-poprun: instance 1 on localhost failed first with exit code 5; every " \
           "instance was stopped" in out.stdout
    assert out.stderr.count("ringflow-poprun-exit x 9 1.0") == 3  # shown, not consumed


@pytest.mark.multiproc
def test_a_bad_command_line_exits_2_with_one_line_and_starts_nothing(mpirun):
    out = poprun(["--num-instances=3", "--host=a,b", "true"])
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "ringflow-poprun: error: --num-instances=3 cannot be divided evenly among 2 hosts (a,b)"]


def test_help_exits_0_and_the_console_script_is_installed():
    script = Path(sys.executable).parent / "ringflow-poprun"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("usage: ringflow-poprun")


@pytest.fixture
def marker():
    """A word on the job's command lines; whatever carries it is killed after the test."""
    word = f"poprun-test-{uuid.uuid4().hex[:8]}"
    yield word
    for pid in marker_processes(word):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_job(marker: str, instances: int = 2) -> subprocess.Popen:
    script = f"import time  # {marker}\ntime.sleep(60)"
    return subprocess.Popen([*POPRUN, f"--num-instances={instances}", sys.executable, "-c",
                             script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "provider")},
                            stdin=subprocess.DEVNULL)


def job_pids(marker: str, *start: str) -> list[int]:
    """Pids of the processes with `marker` on their command line that starts with `start`."""
    return [pid for pid, argv in marker_processes(marker).items()
            if argv[:len(start)] == list(start)]


def wait_started(marker: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(job_pids(marker, sys.executable, "-c")) < count:
        assert time.monotonic() < deadline, f"the {count} instances did not start"
        time.sleep(0.1)


@pytest.mark.multiproc
def test_sigterm_stops_every_instance_and_exits_143(mpirun, marker):
    job = start_job(marker)
    wait_started(marker, 2)
    job.send_signal(signal.SIGTERM)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 128 + signal.SIGTERM
    assert "stopped by signal SIGTERM; mpirun stopped every instance" in out
    assert wait_gone(marker) == {}


@pytest.mark.multiproc
def test_a_sigkilled_poprun_leaves_no_instance(mpirun, marker):
    job = start_job(marker)
    wait_started(marker, 2)
    job.kill()
    job.communicate(timeout=30)
    assert wait_gone(marker) == {}


@pytest.mark.multiproc
def test_instances_that_outlive_a_sigkilled_mpirun_are_stopped(mpirun, marker):
    job = start_job(marker)
    wait_started(marker, 2)
    mpirun_pid, = job_pids(marker, "mpirun")  # argv[0] as ringflow-poprun runs it
    os.kill(mpirun_pid, signal.SIGKILL)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 128 + signal.SIGKILL
    assert "of the job outlived mpirun here: stopping them" in out
    assert wait_gone(marker) == {}


@pytest.mark.multiproc
def test_a_job_id_on_the_command_line_is_the_jobs_and_the_token_from_the_env_is_kept(mpirun):
    env = {k: v for k, v in os.environ.items() if k != "RINGFLOW_JOB_ID"}
    token = JOB_ENV["RINGFLOW_JOB_TOKEN"]
    out = subprocess.run([*POPRUN, "--num-instances=2", "--mpi-local-args=-x RINGFLOW_JOB_ID="
                          "from_argv -x RINGFLOW_JOB_TOKEN", sys.executable, "-c", _SHOW_ENV],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env={**env, "RINGFLOW_JOB_TOKEN": token,
                              "PYTHONPATH": str(REPO / "provider")})
    assert out.returncode == 0, out.stderr
    seen = instance_json(out.stdout)
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert [(s["job_id"], s["token_sha"]) for s in seen.values()] == [("from_argv", digest)] * 2
    assert "; job from_argv; " in out.stdout and "warning" not in out.stdout


# Two ringflow workers; rank 1 fails after a collective.
_RING_WORKER = """import os, sys
import numpy as np
import ringflow.distributed as dist
dist.init_parallel_env()
x = np.ones(4)
dist.all_reduce(x)
print("reduced", x[0], flush=True)
if dist.get_rank() == 1:
    sys.exit(4)
dist.all_reduce(x)
"""


@pytest.mark.multiproc
def test_ringflow_workers_report_when_they_begin_to_exit_and_the_cause_is_named(mpirun):
    ports = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    out = poprun(["--num-instances=2", f"--mpi-local-args=-x PADDLE_TRAINERS_NUM=2 -x "
                  f"PADDLE_TRAINER_ENDPOINTS={ports}",
                  "--instance-mpi-local-args=0:-x PADDLE_TRAINER_ID=0",
                  "--instance-mpi-local-args=1:-x PADDLE_TRAINER_ID=1",
                  sys.executable, "-c", _RING_WORKER], env=JOB_ENV)
    assert out.returncode == 4, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if "reduced" in line) == [
        "[1,0]<stdout>:reduced 2.0", "[1,1]<stdout>:reduced 2.0"]
    assert "ringflow-poprun: instance 1 on localhost failed first with exit code 4" in out.stdout
    assert "ringflow-exit-time" not in out.stdout + out.stderr  # consumed by ringflow-poprun


def test_a_worker_reports_its_exit_time_only_when_asked():
    script = ("import ringflow.distributed.collective.registry as r\n"
              "r._rings[0] = type('Ring', (), {'close': lambda self, goodbye: None})()")
    env = {**os.environ, "PYTHONPATH": str(REPO / "provider")}
    asked = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**env, "RINGFLOW_REPORT_EXIT_TIME": "1"}, timeout=30)
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, timeout=30)
    assert RANK_EXIT_LINE.match(asked.stderr.strip()) and quiet.stderr == ""
