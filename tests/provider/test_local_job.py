"""LocalJob and the line splitter: whole lines whatever the chunking, `\\r` as a line end,
long lines in 1 MiB pieces, flat memory under 10 MiB of progress output, shell-style exit
codes, a stop that returns at once and empties the group within the grace, and a job tied
to its owner: SIGKILL of the process that owns a LocalJob of the real launcher (--stdin)
leaves no launcher, no rank and no shared-memory segment."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from ringflow.errors import LaunchError
from ringflow.launch.processes import live_groups
from ringflow.launch.stdin import encode_secrets
from ringflow_provider.jobs.lines import MAX_LINE_BYTES, LineSplitter
from ringflow_provider.jobs.local import LocalJob
from tests.procs import alive, marked_processes
from tests.provider import progress_flood
from tests.provider.conftest import wait_until
from tests.provider.progress_flood import Redraws

pytestmark = pytest.mark.timeout(60)

MARK_VAR = "RINGFLOW_TEST_MARK"
OWNER = Path(__file__).with_name("local_job_owner.py")

# A rank of a real launcher job: a shm segment of the job (as a crashed rank leaves one), a
# child in its group, its pids and whether the token reached it, then it waits.
HOLDER = """
    import hashlib, json, os, subprocess, time
    rank = os.environ["PADDLE_TRAINER_ID"]
    job = os.environ["RINGFLOW_JOB_ID"]
    open(f"/dev/shm/ringflow-{job}-held{rank}", "wb").close()
    child = subprocess.Popen(["sleep", "1000"])
    token = hashlib.sha256(os.environ["RINGFLOW_JOB_TOKEN"].encode()).hexdigest()
    info = {"worker": os.getpid(), "child": child.pid, "token_sha": token}
    with open(f"pids.{rank}.tmp", "w") as f:
        f.write(json.dumps(info) + "\\n")
    os.rename(f"pids.{rank}.tmp", f"pids.{rank}")
    print("holding", rank, flush=True)
    time.sleep(1000)
"""


class Lines:
    """An on_line sink that keeps (stream, line) in order."""

    def __init__(self):
        self.got: list[tuple[str, str]] = []

    def __call__(self, stream: str, line: str) -> None:
        self.got.append((stream, line))

    def of(self, stream: str) -> list[str]:
        return [line for s, line in self.got if s == stream]


def python(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


def run(argv: list[str], timeout: float = 30, **kw) -> tuple[int | None, Lines]:
    lines = Lines()
    with LocalJob(argv, lines, **kw) as job:
        job.start()
        code = job.wait(timeout=timeout)
    return code, lines


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries the test's mark."""
    return marked_processes(MARK_VAR, mark)


@pytest.fixture
def job_env(tmp_path):
    """An environment whose processes the test can find (and kill if one is left), with a
    fresh job id; fails the test if a process or a shm segment of the job is left."""
    mark, job_id = uuid.uuid4().hex, "lj" + uuid.uuid4().hex[:12]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_", "PADDLE_"))}
    env.update({MARK_VAR: mark, "RINGFLOW_JOB_ID": job_id})
    yield env
    deadline = time.monotonic() + 10
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = marked(mark)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shm = sorted(p.name for p in Path("/dev/shm").glob(f"ringflow-{job_id}-*"))
    for name in shm:
        Path("/dev/shm", name).unlink(missing_ok=True)
    assert not left, f"processes left behind: {left}"
    assert not shm, f"shared-memory segments left behind: {shm}"


# -- the line splitter -----------------------------------------------------------------------

def split(data: bytes, cuts: list[int], max_line: int = MAX_LINE_BYTES) -> list[str]:
    lines: list[str] = []
    splitter = LineSplitter("stdout", lambda _, line: lines.append(line), max_line=max_line)
    start = 0
    for cut in [*cuts, len(data)]:
        splitter.feed(data[start:cut])
        start = cut
    splitter.flush()
    return lines


def test_whole_lines_are_the_same_whatever_the_chunks_they_arrive_in():
    data = "a\r\nb\rc\n\nd\r\ré f\r\n10%\r20%\rlast".encode()
    expected = ["a", "b", "c", "", "d", "", "é f", "10%", "20%", "last"]
    rng = random.Random(7)
    for _ in range(500):  # every chunking, incl. \r | \n and inside the 2-byte é
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, 12)))
        assert split(data, cuts) == expected, cuts
    assert split(data, list(range(1, len(data)))) == expected  # one byte at a time


def test_a_line_over_the_cap_comes_in_pieces_cut_between_characters():
    text = "aé€😀" * 10  # 1-, 2-, 3- and 4-byte characters
    pieces = split(text.encode() + b"\nnext\n", [3, 17], max_line=8)
    assert pieces[-1] == "next"
    assert "".join(pieces[:-1]) == text
    assert all(len(p.encode()) <= 8 and "\ufffd" not in p for p in pieces)


# -- LocalJob ----------------------------------------------------------------------------------

@pytest.mark.multiproc
def test_lines_reach_on_line_whole_and_while_the_job_runs(tmp_path):
    go = tmp_path / "go"
    lines = Lines()

    def on_line(stream, line):
        lines(stream, line)
        if line == "second":  # the job waits for this: the line came while it ran
            go.touch()

    argv = python(f"""
        import os, sys, time
        out = sys.stdout.buffer
        out.write(b"par"); out.flush(); time.sleep(0.2)
        out.write(b"tial\\r\\nsec"); out.flush(); time.sleep(0.1)
        out.write(b"ond\\n"); out.flush()
        sys.stderr.write("oops\\n"); sys.stderr.flush()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        out.write(b"last without a newline"); out.flush()
    """)
    with LocalJob(argv, on_line) as job:
        job.start()
        assert job.wait(timeout=20) == 0
    assert lines.of("stdout") == ["partial", "second", "last without a newline"]
    assert lines.of("stderr") == ["oops"]
    assert sorted(job.tail) == sorted(line for _, line in lines.got)


@pytest.mark.multiproc
def test_a_carriage_return_ends_a_line():
    code, lines = run(["printf", "10%%\\r20%%\\r30%%\\r\\ndone\\n"])
    assert code == 0
    assert lines.of("stdout") == ["10%", "20%", "30%", "done"]


@pytest.mark.multiproc
def test_a_2_mib_line_is_passed_on_in_1_mib_pieces():
    code, lines = run(python("""
        import sys
        sys.stdout.buffer.write(b"x" * (2 << 20) + b"\\nafter\\n")
    """))
    assert code == 0
    assert [len(line) for line in lines.of("stdout")] == [1 << 20, 1 << 20, 5]
    assert lines.of("stdout")[-1] == "after"


@pytest.mark.multiproc
def test_10_mib_of_progress_output_streams_as_lines_with_flat_memory():
    seen = Redraws()
    with LocalJob(python(progress_flood.SCRIPT), seen) as job:
        job.start()
        assert job.wait(timeout=50) == 0
    assert (seen.lines, seen.bad) == (progress_flood.COUNT, 0)
    assert progress_flood.COUNT * len(progress_flood.UPDATE % 0) > 10 << 20
    # Holding the output (10 MiB as bytes, again as text) would grow far more than this.
    growth = seen.growth()
    assert growth < 8 << 20, f"RSS grew {growth / 2**20:.1f} MiB"


@pytest.mark.multiproc
@pytest.mark.parametrize(("script", "code"), [("exit 0", 0), ("exit 3", 3),
                                              ("kill -TERM $$", 143), ("kill -KILL $$", 137),
                                              ("kill -SEGV $$", 139)])
def test_the_exit_code_is_shell_style_with_128_plus_n_for_signal_n(script, code):
    assert run(["sh", "-c", script])[0] == code


def test_a_command_that_cannot_start_is_a_launch_error_naming_it(tmp_path):
    job = LocalJob([str(tmp_path / "no-such-command")], Lines())
    with pytest.raises(LaunchError, match=r"^cannot start '.*no-such-command': "):
        job.start()


def _wait_for_line(job: LocalJob, lines: Lines, wanted: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while wanted not in lines.of("stdout"):
        assert time.monotonic() < deadline, f"no line {wanted!r} within {timeout} s"
        assert job.wait(timeout=0.05) is None, f"the job ended: {lines.got}"


@pytest.mark.multiproc
def test_stop_returns_at_once_and_the_group_is_gone_within_the_grace(job_env):
    """Leader and child ignore SIGTERM: only the SIGKILL after the grace ends them."""
    lines = Lines()
    argv = ["sh", "-c", "trap '' TERM; sleep 1000 & echo ready; wait"]
    with LocalJob(argv, lines, env=job_env, grace_s=1.0) as job:
        job.start()
        _wait_for_line(job, lines, "ready")
        started = time.monotonic()
        said = job.stop()
        stop_s = time.monotonic() - started
        assert job.wait(timeout=10) == 137
        wait_until(lambda: not live_groups([job.pgid]), 5, "the group to empty")
        gone_s = time.monotonic() - started
    assert stop_s < 2.0, f"stop() took {stop_s:.2f} s"
    assert said == f"sent SIGTERM to process group {job.pgid}; SIGKILL in 1 s if it still runs"
    assert 1.0 <= gone_s < 1.0 + 3.0, f"group gone after {gone_s:.2f} s"
    assert job.stop() == f"already stopping process group {job.pgid}"


@pytest.mark.multiproc
def test_stop_from_a_signal_handler_while_wait_runs_ends_the_job(job_env):
    """Airflow calls on_kill from its SIGTERM handler, in the thread that runs execute."""
    lines = Lines()
    with LocalJob(["sh", "-c", "echo ready; exec sleep 1000"], lines, env=job_env) as job:
        job.start()
        _wait_for_line(job, lines, "ready")
        previous = signal.signal(signal.SIGALRM, lambda *_: job.stop())
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            code = job.wait(timeout=10)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    assert code == 143 and job.stop_requested


@pytest.mark.multiproc
def test_leaving_the_with_block_stops_what_is_left_of_the_group(job_env):
    lines = Lines()
    argv = ["sh", "-c", "sleep 1000 > /dev/null 2>&1 & echo $!"]
    with LocalJob(argv, lines, env=job_env, grace_s=1.0) as job:
        job.start()
        assert job.wait(timeout=10) == 0  # the leader is done, its child lives on
        child = int(lines.of("stdout")[0])
        assert live_groups([job.pgid]) == {job.pgid}
    wait_until(lambda: not Path(f"/proc/{child}").exists()
               or Path(f"/proc/{child}/stat").read_text().split()[2] in "ZX", 5,
               "the child left in the group to end")


def _start_launcher_job(tmp_path: Path, job_env: dict, token: str, lines: Lines) -> LocalJob:
    (tmp_path / "holder.py").write_text(textwrap.dedent(HOLDER))
    argv = [sys.executable, "-m", "ringflow.launch", "--stdin", "--nproc-per-host", "2",
            "--log-dir", "log", "holder.py"]
    job = LocalJob(argv, lines, env=job_env, cwd=tmp_path,
                   stdin_line=encode_secrets({"RINGFLOW_JOB_TOKEN": token}))
    job.start()
    return job


def _holders(tmp_path: Path, ranks: int = 2) -> list[dict]:
    paths = [tmp_path / f"pids.{r}" for r in range(ranks)]
    wait_until(lambda: all(p.exists() for p in paths), 20, "every rank to start")
    return [json.loads(p.read_text()) for p in paths]


@pytest.mark.multiproc
def test_stopping_a_launcher_job_stops_every_rank_and_removes_its_segments(tmp_path, job_env):
    """What TPTrainOperator.on_kill does: stop() on a LocalJob of `ringflow.launch --stdin`."""
    token = "tok-" + uuid.uuid4().hex
    lines = Lines()
    with _start_launcher_job(tmp_path, job_env, token, lines) as job:
        _wait_for_line(job, lines, "[rank 1] holding 1")
        holders = _holders(tmp_path)
        job.stop()
        assert job.wait(timeout=20) == 143
    expected = hashlib.sha256(token.encode()).hexdigest()
    assert [h["token_sha"] for h in holders] == [expected, expected]
    out = lines.of("stdout")
    assert "[launch] the launcher received SIGTERM; stopping all ranks" in out
    result = json.loads(out[-1].removeprefix("[launch] result "))
    assert (result["status"], result["exit_code"]) == ("stopped", 143)
    assert sorted(result["shm_removed"]) == [f"ringflow-{job_env['RINGFLOW_JOB_ID']}-held{r}"
                                             for r in (0, 1)]
    assert not any(token in line for _, line in lines.got)


@pytest.mark.multiproc
def test_sigkill_of_the_owner_leaves_no_launcher_rank_or_segment(tmp_path, job_env):
    """The owner dies as a task process does when Airflow's supervisor SIGKILLs it: the
    launcher's stdin ends, and it stops its ranks and sweeps the job's segments."""
    (tmp_path / "holder.py").write_text(textwrap.dedent(HOLDER))
    token = "tok-" + uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, str(OWNER), str(tmp_path), "2", "holder.py"],
                             env={**job_env, "RINGFLOW_JOB_TOKEN_FOR_STDIN": token},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        launcher = int(owner.stdout.readline().split()[1])
        holders = _holders(tmp_path)
        pids = [launcher] + [pid for h in holders for pid in (h["worker"], h["child"])]
        segments = list(Path("/dev/shm").glob(f"ringflow-{job_env['RINGFLOW_JOB_ID']}-*"))
        assert len(segments) == 2
        assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                    if _holds(p, token.encode())]
        killed = time.monotonic()
        owner.kill()
        owner.wait(timeout=10)
        # A process in the middle of exiting has already dropped its memory (its environ
        # reads empty, so it no longer looks marked) but is not a zombie yet: wait for both.
        wait_until(lambda: not marked(job_env[MARK_VAR]) and not alive(pids), 15,
                   "every process of the job to end")
        gone_s = time.monotonic() - killed
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
        owner.stdout.close()
    assert alive(pids) == []
    assert not any(p.exists() for p in segments)
    # The ranks end on SIGTERM at once; the launcher's grace is 5 s.
    assert gone_s < 5.0 + 3.0, f"took {gone_s:.1f} s"


def _holds(path: Path, needle: bytes) -> bool:
    try:
        return needle in path.read_bytes()
    except OSError:
        return False
