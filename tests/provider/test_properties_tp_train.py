"""Property: whatever TPTrainOperator is given (generated argument sets: the job spec,
the hosts and their interpreter, the launcher, ports, folders, variables; hostile and
valid), it either refuses them with RingflowConfigException naming the argument (never an
error from inside, such as a KeyError, shown as one), or what it sends each host adds
nothing: the shell text is the skeleton with each value inside one word, the agent's command
line reads back as the values given, the variables exported are exactly the plain ones and
the job's own (the secret ones travel on stdin only), and the spec file reads back as the
spec.

The hosts only record what they are sent (tests/provider/composed.py says why).
"""

from __future__ import annotations

import contextlib
import json
import sys
import types

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ringflow.errors import ConfigError
from ringflow.launch.config import build_parser
from ringflow.launch.mpirun import parse as parse_mpirun_agents
from ringflow.launch.stdin import ENV_KEY
from ringflow.train.spec import JobSpec
from ringflow_provider.exceptions import RingflowConfigException, RingflowLaunchException
from ringflow_provider.jobs.masking import split_env
from ringflow_provider.launchers import commands
from ringflow_provider.launchers import ssh as ssh_module
from ringflow_provider.launchers.base import TASK_VAR
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.job import TaskKey
from ringflow_provider.operators import tp_train as tp_module
from ringflow_provider.operators.tp_train import TPTrainOperator
from ringflow_provider.tp_train.spec import SPEC_FIELDS
from tests.hostile import (
    OMIT,
    PROPERTY_SETTINGS,
    anything,
    as_json_text,
    env_map,
    hostile_text,
    mostly_valid,
    remote_words,
    same_shape,
    text_or,
)
from tests.provider import composed
from tests.provider.composed import SHIPPED, Composed, recording_launcher
from tests.provider.contexts import TaskInstanceStub

pytestmark = pytest.mark.slow

TOKEN = "cd" * 32
PORT = 30000
ARGUMENTS = (*SPEC_FIELDS, "nproc_per_host", "log_dir", "extra_env", "secret_env", "hosts",
             "ssh_conn_id", "python", "launcher", "base_port", "deferrable", "poll_interval",
             "lease_timeout", "on_existing")
# errors of the operator's own checks; anything else would be a traceback from inside
REFUSALS = (ValueError, ConfigError)


def _maybe(*values) -> st.SearchStrategy:
    return st.sampled_from([OMIT, *values])


def _int_or_text(low: int, high: int) -> st.SearchStrategy:
    return st.one_of(st.integers(low, high), st.integers(low, high).map(str),
                     st.sampled_from([" 2 ", "1.5", "", "two", True, None, 2**70]),
                     hostile_text())


_HOSTS = st.lists(st.sampled_from(["h1", "node-2", "10.0.0.3"]), min_size=1, max_size=2,
                  unique=True)
VALID = {
    "model": st.sampled_from(["mlp", "transformer", OMIT]),
    "steps": _maybe(3, "5"),
    "global_batch_size": st.sampled_from([8, "8"]),
    "optimizer": _maybe({"type": "sgd", "learning_rate": 0.1},
                        '{"type": "adam", "learning_rate": 0.001}'),
    "checkpoint_dir": _maybe(None, "ck dir", "/tmp/ck"),
    "nproc_per_host": st.sampled_from([1, 2, "2"]),
    "log_dir": _maybe(None, "/tmp/run logs/{dag_id}", "logs/{try_number}"),
    "extra_env": st.one_of(_maybe(None), st.dictionaries(
        st.sampled_from(["A", "FOO", "DB_PASSWORD"]), st.sampled_from(["1", "a b", "$(id)"]),
        max_size=2)),
    "secret_env": _maybe({"S": "p a'ss$(id)"}),
    "hosts": st.one_of(_maybe(None, ""), _HOSTS, _HOSTS.map(",".join)),
    "launcher": _maybe("ssh", "mpirun"),
    "python": _maybe("python3", "/usr/bin/python3"),
    "base_port": _maybe(None, 20000),
}
HOSTILE = {
    "model": text_or("mlp", "transformer", "pkg.mod:build"),
    "model_args": as_json_text(st.dictionaries(text_or("hidden_size", "num_layers"),
                                               anything(), max_size=2)),
    "data": text_or("synthetic", "/data/x.npz"),
    "optimizer": st.one_of(as_json_text(st.dictionaries(
        text_or("type", "learning_rate", "momentum"), anything(), max_size=3)), anything()),
    "lr_schedule": st.one_of(anything(), as_json_text(st.dictionaries(
        text_or("type", "step_size"), anything(), max_size=2))),
    "grad_clip": anything(),
    "steps": _int_or_text(-1, 5),
    "global_batch_size": _int_or_text(-1, 9),
    "seed": _int_or_text(-2, 3),
    "tensor_parallel_degree": _int_or_text(0, 3),
    "dtype": text_or("float32", "float64"),
    "log_every": _int_or_text(0, 3),
    "checkpoint_dir": text_or("ck", "/tmp/ck"),
    "checkpoint_every": _int_or_text(0, 3),
    "resume": anything(),
    "amp": anything(),
    "recompute": st.one_of(anything(), st.lists(text_or("h_0"), max_size=2)),
    "sharding_stage": _int_or_text(-1, 3),
    "nproc_per_host": _int_or_text(-1, 3),
    "log_dir": text_or("/tmp/logs", "logs/{dag_id}/{run_id}", "{try_number:>9}", "{0}",
                       "{home.x}"),
    "extra_env": as_json_text(env_map()),
    "secret_env": as_json_text(env_map()),
    "hosts": st.one_of(st.lists(text_or("h1", "10.0.0.3"), max_size=3),
                       text_or("h1,h2", "10.0.0.3")),
    "ssh_conn_id": st.one_of(text_or("ssh_default", "other"), anything()),
    "python": text_or("python3", "/opt/py/bin/python3"),
    "launcher": text_or("ssh", "mpirun", "local"),
    "base_port": _int_or_text(1000, 66000),
    "poll_interval": st.one_of(st.floats(), text_or("10")),
    "lease_timeout": st.one_of(st.floats(), text_or("60", "none")),
    "on_existing": text_or("reattach", "restart"),
    "deferrable": st.one_of(st.booleans(), text_or("true", "no")),
}


@contextlib.contextmanager
def known_ids(home):
    """The job's id, token and ports as known values, so the expected commands are exact;
    the hosts recording; RINGFLOW_HOME `home`."""
    mp = pytest.MonkeyPatch()
    composed.known_identity(mp, tp_module, TOKEN)
    mp.setattr(tp_module, "get_launcher", recording_launcher)
    mp.setattr(ssh_module, "random", types.SimpleNamespace(
        Random=lambda: types.SimpleNamespace(randint=lambda a, b: PORT)))
    mp.setenv("RINGFLOW_HOME", str(home))
    composed.ssh_connections(mp, "SSH_DEFAULT", "OTHER")  # read for their allowed_hosts, never used
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def fixed_ids(tmp_path_factory):
    with known_ids(tmp_path_factory.mktemp("ringflow-home")):
        yield


def check_refusal(exc: RingflowConfigException, values: dict) -> None:
    """The message names an argument, and what refused it was one of the operator's own
    checks, not an error from inside (a KeyError, a TypeError, ...)."""
    message = str(exc)
    cause = exc.__cause__ or exc.__context__
    assert cause is None or isinstance(cause, REFUSALS), (type(cause), message)
    named = [name for name in ARGUMENTS if name in message]
    assert named, f"no argument named in {message!r}"


def expected_agents(plan: dict, launcher: str, log_dir: str) -> list[tuple[str, list[str]]]:
    """(host, argv) each host runs: the agent command, as DESIGN.md section 2 has it."""
    hosts, nproc, python = plan["hosts"], str(plan["nproc"]), plan["python"]
    train = ["-m", "ringflow.train", f"{log_dir}/spec.json"]
    port = str(plan["base_port"] or PORT)
    if launcher == "local":
        return [(None, [sys.executable, "-m", "ringflow.launch", "--stdin",
                        "--nproc-per-host", nproc, "--log-dir", log_dir, *train])]
    joined = ",".join(hosts)
    if launcher == "ssh":
        return [(host, [python, "-m", "ringflow.launch", "--stdin", "--nproc-per-host", nproc,
                        "--hosts", joined, "--host-index", str(i), "--base-port", port,
                        "--log-dir", log_dir, *train]) for i, host in enumerate(hosts)]
    plain, _ = split_env(plan["extra"])
    exports = ",".join(dict.fromkeys(["PYTHONPATH", TASK_VAR, *plain, "PYTHONUNBUFFERED",
                                      "RINGFLOW_HEARTBEAT_TIMEOUT"]))
    agent = [python, "-m", "ringflow.launch", "--nproc-per-host", nproc, "--hosts", joined,
             "--host-index-env", "OMPI_COMM_WORLD_RANK", "--base-port", port, "--log-dir",
             log_dir, *train]
    return [(hosts[0], [python, "-m", "ringflow.launch.mpirun", "--hosts", joined, "--stdin",
                        "--export", exports, "--", *agent])]


def check_agent_reads_back(argv: list[str], plan: dict, log_dir: str, launcher: str) -> None:
    """The agent's own parser (ringflow.launch) reads the values given, nothing else."""
    if launcher == "mpirun":
        ns = parse_mpirun_agents(argv[3:])
        assert ns.export.split(",")[2:] == [*split_env(plan["extra"])[0], "PYTHONUNBUFFERED",
                                            "RINGFLOW_HEARTBEAT_TIMEOUT"]
        argv = ns.agent
    ns = build_parser().parse_args(argv[3:])
    assert (ns.log_dir, ns.nproc_per_host, ns.module, ns.target, ns.args) == (
        log_dir, plan["nproc"], True, "ringflow.train", [f"{log_dir}/spec.json"])
    if plan["hosts"]:
        assert ns.hosts == ",".join(plan["hosts"])


def check_start(sent, plan: dict, op: TPTrainOperator, launcher: str) -> None:
    log_dir = plan["log_dir"]
    parts = expected_agents(plan, launcher, log_dir)
    assert len(sent) == len(parts)
    task = TaskKey("d", "t", "r", 1)
    plain, hidden = split_env(plan["extra"])
    env = {**plain, "PYTHONUNBUFFERED": "1",
           "RINGFLOW_HEARTBEAT_TIMEOUT": f"{plan['heartbeat']:g}",
           "RINGFLOW_JOB_ID": composed.JOB_ID, TASK_VAR: task.key}
    if launcher != "local":
        env["PYTHONPATH"] = SHIPPED
    secrets = ["RINGFLOW_JOB_TOKEN", *hidden, *plan["secret"]]
    state = f"{tp_module.ringflow_home()}/jobs" if launcher == "local" else ".ringflow/jobs"
    runtime = Runtime(sys.executable) if launcher == "local" else Runtime("PHPYTHONX",
                                                                          SHIPPED)
    for part, (host, argv) in zip(sent, parts):
        assert part.host == host or launcher == "local"
        check_agent_reads_back(argv, plan, log_dir, launcher)
        values = {"PHPYTHONX": plan["python"]}
        values.update({f"PHARGV{i}X": token for i, token in enumerate(argv)})
        values.update({f"PHENVNAME{i}X": name for i, name in enumerate(env)})
        values.update({f"PHENVVALUE{i}X": value for i, value in enumerate(env.values())})
        values.update({f"PHSECRET{i}X": name for i, name in enumerate(dict.fromkeys(secrets))})
        skeleton = commands.start_command(
            runtime, f"{state}/{task.key}/try-1", [f"PHARGV{i}X" for i in range(len(argv))],
            env={f"PHENVNAME{i}X": f"PHENVVALUE{i}X" for i in range(len(env))},
            secrets="stdin", lease_timeout=op.lease_timeout, grace_s=tp_module._STOP_GRACE_S,
            handle={"PHHANDLEX": 1},
            secret_names=[f"PHSECRET{i}X" for i in range(len(dict.fromkeys(secrets)))])
        got, want = remote_words(part.command), remote_words(skeleton)
        handle = json.dumps({"PHHANDLEX": 1})
        at = want.index(handle)
        assert at < len(got), "the shell text is shorter than the skeleton"
        values[handle] = got[at]
        assert json.loads(got[at])["job_id"] == composed.JOB_ID
        same_shape(got, want, values)
        assert set(json.loads(part.stdin)[ENV_KEY]) == set(secrets)


BASE = {"model": "mlp", "global_batch_size": 8, "nproc_per_host": 1}


@PROPERTY_SETTINGS
@given(values=mostly_valid(VALID, HOSTILE))
# what the property found: a KeyError or IndexError of log_dir's str.format shown as a
# config error, a ValueError (NUL) and an OSError (a name too long) from inside execute
@example(values={**BASE, "log_dir": "{0}"})
@example(values={**BASE, "log_dir": "{home.__class__}", "hosts": ["h1"]})
@example(values={**BASE, "log_dir": "{try_number:>999999999}"})
@example(values={**BASE, "log_dir": "-x", "hosts": ["h1"], "launcher": "mpirun"})
@example(values={**BASE, "checkpoint_dir": "\0"})
@example(values={**BASE, "checkpoint_dir": "a" * 300})
@example(values={**BASE, "deferrable": "maybe"})
@example(values={**BASE, "extra_env": {"A0": "\0"}})
@example(values={**BASE, "extra_env": {"DB_PASSWORDé": "1"}})
def test_tp_train_operator_arguments_are_refused_by_name_or_add_nothing(fixed_ids, values):
    try:
        op = TPTrainOperator(task_id="t", **values)
    except RingflowConfigException as exc:
        check_refusal(exc, values)
        return
    check_operator(op, values)


def check_operator(op: TPTrainOperator, values: dict) -> None:
    """Validate as `execute` does, then run it up to the start of the job: refused naming
    the argument, or the commands sent and the spec file add nothing."""
    context = {"ti": TaskInstanceStub("d", "t", run_id="r")}
    try:
        plan = op._plan(context)
    except RingflowConfigException as exc:
        check_refusal(exc, values)
        return
    # execute plans the same (a pure function of the arguments and the context): it takes
    # this plan rather than building the model a second time for the memory estimate
    object.__setattr__(op, "_plan", lambda _context: plan)
    try:
        op.execute(context)
    except RingflowConfigException as exc:  # the watch arguments, checked as the job starts
        check_refusal(exc, values)
        return
    except RingflowLaunchException as exc:  # a connection id that names no connection
        unknown = set((plan["conns"] or {}).values()) - {"ssh_default", "other"}
        assert any(str(exc).startswith(f"ssh connection {conn_id!r} cannot be read: "
                                       "AirflowNotFoundException") for conn_id in unknown), exc
        return
    except Composed as stopped:
        sent, files = stopped.sent, stopped.files
    else:
        raise AssertionError("execute neither refused nor started the job")
    check_start(sent, plan, op, plan["launcher"])
    for (_, path), text in files.items():
        assert path == f"{plan['log_dir']}/spec.json"
        assert JobSpec.from_dict(json.loads(text)) == plan["spec"]
