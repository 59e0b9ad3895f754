"""Secrets of a TPTrainOperator job (``secret_env``, ``extra_env`` under secret names, the job
token) on hosts that are real hosts (tests/hosts.py), for each launcher, and of a
PopRunOperator job running ringflow-poprun on Open MPI: never on a command
line of any process on any host (every execve traced with strace, from the host's sshd and
from this process, for the whole job), never in clear on the network between the hosts (a
tcpdump of their bridge, TCP reassembled), never in a file the job wrote (job, log and
checkpoint folders, /tmp); and still in the ranks' environment. A plain ``extra_env`` value
is the control: it must show where the watch looks (on a command line, on the wire for
mpirun), so each watch is proven to see what it is meant to.

One job per launcher (a module fixture), watched from start to on_kill; each test asserts
one thing about what was recorded."""

from __future__ import annotations

import os
import secrets as token_source
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator
from tests.provider.conftest import REPO, hosts_connection, wait_until
from tests.provider.contexts import TaskInstanceStub
from tests.provider.test_poprun_operator import RecordingLog
from tests.secret_watch import Capture, ExecTrace, children, files_holding

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]
MLP = {"input_size": 8, "hidden_size": 256, "num_classes": 4}
LAUNCHERS = ["local", "ssh", "mpirun", "poprun"]  # poprun: PopRunOperator, ringflow-poprun
SCRIPT = REPO / "examples" / "poprun_dp_train.py"
TRAIN_FILES = {"spec.json", "handle.json", "status.json", "output.log", "workerlog.0"}


def _value(kind: str) -> str:
    return f"{kind}{token_source.token_hex(12)}"


@dataclass
class Watched:
    """What one job left to look at."""

    launcher: str
    world: int                         # ranks of the job
    files: set[str]                    # names of files the job surely wrote
    values: dict[str, str]             # what -> value (the secrets and the plain control)
    execs: str = ""                    # every execve's argv, every host and this machine
    wire: dict = field(default_factory=dict)  # the bridge's reassembled flows
    rank_envs: list[dict[str, str]] = field(default_factory=list)
    roots: list[Path] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def secrets(self) -> dict[str, str]:
        return {k: v for k, v in self.values.items() if k != "plain"}


def _environ(pid_dir: Path) -> dict[str, str]:
    try:
        raw = (pid_dir / "environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2]
                for item in raw.split(b"\0") if b"=" in item)


def _comm(pid_dir: Path) -> str:
    """The program's name (not the sh around an mpirun process, whose /proc environ is
    what it started with, not what it exported)."""
    try:
        return (pid_dir / "comm").read_text().strip()
    except OSError:
        return ""


def _rank_envs(procs: list[Path], marker: str) -> list[dict[str, str]]:
    """The environments of the job's ranks (PADDLE_TRAINER_ID set, the control value in)."""
    found = []
    for proc in procs:
        for entry in proc.iterdir() if proc.is_dir() else ():
            if entry.name.isdigit() and _comm(entry).startswith("python"):
                env = _environ(entry)
                if "PADDLE_TRAINER_ID" in env and env.get("RF_PLAIN") == marker:
                    found.append(env)
    return found


def _until(op, predicate, what: str, timeout: float = 120) -> None:
    try:
        wait_until(predicate, timeout, what)
    except AssertionError as exc:
        tail = "\n".join(m for _, m in op.log.records[-20:])
        raise AssertionError(f"{exc}; the task log ends:\n{tail}") from None


@pytest.fixture(scope="module", params=LAUNCHERS)
def watched(request, ns_hosts, tmp_path_factory) -> Watched:
    launcher = request.param
    tmp = tmp_path_factory.mktemp(f"secrets-{launcher}")
    values = {"extra": _value("xs"), "secret": _value("ss"), "plain": _value("pl")}
    hosts = list(ns_hosts)[:2]
    watch = Watched(launcher, 2 if launcher == "local" else 4,
                    {"handle.json", "status.json", "output.log"} if launcher == "poprun"
                    else {*TRAIN_FILES, f"workerlog.{1 if launcher == 'local' else 3}"}, values)
    with pytest.MonkeyPatch.context() as mp:
        args = dict(task_id="train", model="mlp", model_args=MLP, dtype="float32",
                    steps=100000, log_every=1, global_batch_size=256,
                    tensor_parallel_degree=2, nproc_per_host=2, checkpoint_every=3,
                    extra_env={"DB_PASSWORD": values["extra"], "RF_PLAIN": values["plain"]},
                    secret_env={"RF_VAULT": values["secret"]})
        if launcher == "local":
            home = tmp / "home"
            mp.setenv("RINGFLOW_HOME", str(home))
            watch.roots = [home]
            procs = [Path("/proc")]
            traced = [os.getpid()]
        else:
            for conn_id, conn in ns_hosts.connections("ringflow_sec").items():
                mp.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", conn)
            addresses = [h.address for h in hosts]
            args.update(hosts=addresses, launcher=launcher, python="/usr/bin/python3",
                        ssh_conn_id={a: f"ringflow_sec_{i}" for i, a in enumerate(addresses)})
            watch.roots = [p for h in hosts for p in (
                h.home, Path(f"/proc/{h.init_pid}/root/tmp"),
                Path(f"/proc/{h.init_pid}/root/dev/shm"))]
            procs = [Path(f"/proc/{h.init_pid}/root/proc") for h in hosts]
            # each host's sshd (everything SSH starts there) and this process (the launcher)
            traced = [os.getpid(), *(c for h in hosts for c in children(h.init_pid))]
        if launcher == "poprun":
            op = _poprun(mp, tmp, hosts, args)
        else:
            op = TPTrainOperator(**args)
        op._cached_logger = RecordingLog()
        context = {"ti": TaskInstanceStub("secrets", "train", f"run-{uuid.uuid4().hex[:8]}")}
        done = threading.Event()

        def run() -> None:
            try:
                op.execute(context)
            except BaseException as exc:  # on_kill ends it; recorded for the message
                watch.error = exc
            done.set()

        capture = Capture([h.veth for h in hosts], tmp)
        with ExecTrace(traced, tmp / "execs.txt") as trace, capture:
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                _until(op, lambda: len(_rank_envs(procs, values["plain"])) >= watch.world or
                       done.is_set(), "every rank of the job to run")
                watch.rank_envs = _rank_envs(procs, values["plain"])
                # a checkpoint is written at step 3
                step = "<stdout>:step 5 " if launcher == "poprun" else "step 5/"
                _until(op, lambda: done.is_set() or any(
                    step in m for _, m in op.log.records), "step 5")
            finally:
                op.on_kill()
                thread.join(60)
        watch.execs = trace.text()
        watch.wire = capture.streams()
        if launcher != "local":
            for host in hosts:
                wait_until(lambda host=host: not host.leftovers(), 30,
                           f"{host.address}: every process of the job to end")
    return watch


def _poprun(mp, tmp: Path, hosts, args: dict) -> PopRunOperator:
    """PopRunOperator running ringflow-poprun (Open MPI) on the hosts, one connection for
    both (host keys from a known_hosts of the test's own HOME), the script in each home."""
    hosts_connection(mp, tmp / "worker-home", hosts, "ringflow_sec_poprun")
    for host in hosts:
        (host.home / SCRIPT.name).write_text(SCRIPT.read_text())
    return PopRunOperator(
        task_id="poprun", hosts=[h.address for h in hosts], nproc_per_host=2,
        ipus_per_replica=1, num_ipus=4, ipu_partition="pod4", vipu_server="127.0.0.1",
        training_script=f"/root/{SCRIPT.name}", training_script_args=["--steps", "1000000"],
        python="/usr/bin/python3", poprun="ringflow-poprun", ssh_conn_id="ringflow_sec_poprun",
        ringflow_job=True, extra_env=args["extra_env"], secret_env=args["secret_env"])


def test_the_ranks_get_every_secret_in_their_environment(watched):
    assert len(watched.rank_envs) == watched.world, watched.error
    for env in watched.rank_envs:
        assert env["DB_PASSWORD"] == watched.values["extra"]
        assert env["RF_VAULT"] == watched.values["secret"]
        assert len(env["RINGFLOW_JOB_TOKEN"]) == 64


def test_no_secret_is_on_any_command_line_on_any_host(watched):
    token = watched.rank_envs[0]["RINGFLOW_JOB_TOKEN"]
    assert watched.values["plain"] in watched.execs  # the control: the trace sees commands
    for what, value in {**watched.secrets, "token": token}.items():
        lines = [line[:300] for line in watched.execs.splitlines() if value in line]
        assert lines == [], f"{what} on a command line"


def test_no_secret_is_in_any_file_the_job_wrote(watched):
    names = {Path(folder, name).name for root in watched.roots
             for folder, _, files in os.walk(root) for name in files}
    # the control: the folders searched hold the job's files
    assert watched.files <= names
    if watched.launcher != "poprun":  # and its checkpoints
        assert any(name.endswith(".npz") for name in names), sorted(names)
    token = watched.rank_envs[0]["RINGFLOW_JOB_TOKEN"]
    found = files_holding(watched.roots, [*watched.secrets.values(), token])
    assert all(paths == [] for paths in found.values()), found


@pytest.mark.parametrize("watched", [n for n in LAUNCHERS if n != "local"], indirect=True)
def test_no_secret_crosses_the_network_in_clear(watched):
    # a local job sends nothing between hosts: the launchers that do
    flows = [(key, data) for key, data in watched.wire.items()]
    if watched.launcher == "mpirun":  # the control: mpirun's own TCP carries -x values
        assert any(watched.values["plain"].encode() in data for _, data in flows)
    token = watched.rank_envs[0]["RINGFLOW_JOB_TOKEN"]
    for what, value in {**watched.secrets, "token": token}.items():
        carriers = [key for key, data in flows if value.encode() in data]
        assert carriers == [], f"{what} in clear in {carriers}"
