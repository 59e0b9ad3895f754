"""Property: whatever PopRunOperator is given (generated argument sets, hostile and
valid), it either refuses them with RingflowConfigException naming the argument, or the
command it sends to the launch host adds nothing: the shell text is the skeleton with each
value inside one word at its place, poprun's argv is the seed's with the values at their
places, the variables exported (`export`, poprun's `-x`, and with ringflow-poprun mpirun's
`-x`) are exactly the expected ones, and with ringflow-poprun every instance runs the
training script, nothing else.

The hosts only record what they are sent (tests/provider/composed.py says why); the
commands are the operator's own, from `execute`.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ringflow.errors import ConfigError
from ringflow.launch.openmpi import INSTANCE_NAME, INSTANCE_SH, exported_names
from ringflow.launch.stdin import ENV_KEY
from ringflow.poprun import parse_poprun_args
from ringflow.poprun.mpirun import mpirun_argv as poprun_mpirun_argv
from ringflow_provider.exceptions import RingflowConfigException
from ringflow_provider.jobs.masking import is_hidden
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.commands import Runtime
from ringflow_provider.launchers.job import TaskKey
from ringflow_provider.operators import poprun as poprun_module
from ringflow_provider.operators.poprun import CPU_POPRUN, KILL_GRACE_S, PopRunOperator
from ringflow_provider.poprun import FIELD_NAMES, PopRunConfig, parse_config, validate_field
from tests.hostile import (
    OMIT,
    PROPERTY_SETTINGS,
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

TOKEN = "ab" * 32
DEFAULT_STATE = ".ringflow/jobs"
# flags of poprun the composition never sets itself (those it sets are another rule's)
FLAGS = ("--executable-cache-path=/tmp/cache", "--vipu-cluster=c1", "--offline-mode=yes",
         "--vipu-server-port=8091", "--num-ilds=1", "-v", "--reset-partition=no")
# the rules across fields (the counts; env and mpirun args against the allow_unsafe_* flags)
FIELD_RULES_ACROSS = ("num_ipus", "ipus_per_replica", "nproc_per_host", "extra_env", "secret_env",
                      "mpi_global_args", "extra_poprun_args")


def _int_or_text(low: int, high: int) -> st.SearchStrategy:
    return st.one_of(st.integers(low, high), st.integers(low, high).map(str),
                     st.sampled_from([" 2 ", "0x2", "1e1", "1.5", "", "two", True, None]),
                     hostile_text())


def _bool_or_text() -> st.SearchStrategy:
    return st.one_of(st.booleans(), st.sampled_from(["yes", "no", "true", "False", "1",
                                                     "maybe", "", " true ", None, 2]))


def _maybe(*values) -> st.SearchStrategy:
    """Left out (the default) or one of `values`."""
    return st.sampled_from([OMIT, *values])


def _hosts(names: st.SearchStrategy) -> st.SearchStrategy:
    listed = st.lists(names, min_size=1, max_size=3, unique=True)
    return st.one_of(listed, listed.map(",".join), listed.map(json.dumps))


_ENV = st.dictionaries(st.sampled_from(["A", "FOO", "DB_PASSWORD", "LOG_LEVEL"]),
                       st.sampled_from(["1", "x", "/opt/data", "a,b", "k=v"]), max_size=2)
VALID = {
    "hosts": _hosts(st.sampled_from(["localhost", "node-1", "10.0.0.1"])),
    "nproc_per_host": st.sampled_from([1, 2, "2"]),
    "ipus_per_replica": st.sampled_from([1, 1, 2]),
    "num_ipus": st.sampled_from([12, 24, "12"]),
    "ipu_partition": st.just("pod16"),
    "vipu_server": st.sampled_from(["127.0.0.1", "vipu-host"]),
    "training_script": st.sampled_from(["train.py", "/opt/job/train.py"]),
    "training_script_args": _maybe(["--lr=0.1", "5"], '["-x", "a b"]', []),
    "python": _maybe("python3"),
    "popart_log_level": _maybe(None, "INFO", ""),
    "endpoint_port": _maybe(8091, "9000"),
    "update_partition": _maybe(True, "false"),
    "print_topology": _maybe(False),
    "mpi_global_args": _maybe(None, ["--bind-to", "none"], '["-v"]'),
    "extra_poprun_args": _maybe(None, list(FLAGS[:2]), '["-v"]'),
    "extra_env": st.one_of(_maybe(None), _ENV, _ENV.map(json.dumps)),
    "secret_env": st.one_of(_maybe(None), st.dictionaries(
        st.sampled_from(["S_KEY", "TOKEN"]), st.sampled_from(["p a'ss$(id)", "k"]),
        max_size=2)),
    "poprun": st.sampled_from([OMIT, "poprun", CPU_POPRUN, CPU_POPRUN]),
    "launch_host": _maybe(None, "10.0.0.1", ""),
    "remote_state_dir": _maybe(None, "/tmp/ringflow jobs"),
    "ringflow_job": _maybe(True, "false"),
    "lease_timeout": _maybe(None, 60),
}
HOSTILE = {
    "hosts": _hosts(text_or("localhost", "node-1", "10.0.0.1")),
    "nproc_per_host": _int_or_text(-1, 4),
    "ipus_per_replica": _int_or_text(0, 4),
    "num_ipus": _int_or_text(-1, 16),
    "ipu_partition": text_or("pod16", "p"),
    "vipu_server": text_or("127.0.0.1", "vipu-host"),
    "training_script": text_or("train.py", "/opt/job/train.py", "./-x.py"),
    "training_script_args": as_json_text(st.lists(
        text_or("--lr=0.1", "-x", "5", "--epochs", "a b"), max_size=4)),
    "python": text_or("python3", "/usr/bin/python3"),
    "popart_log_level": text_or("INFO", "DEBUG", ""),
    "endpoint_port": _int_or_text(-1, 70_000),
    "update_partition": _bool_or_text(),
    "vipu_server_timeout": _int_or_text(-1, 300),
    "print_topology": _bool_or_text(),
    "numa_aware": _bool_or_text(),
    "mpi_global_args": as_json_text(st.lists(
        text_or("--bind-to", "none", "-v", "--mca", "btl", "tcp,self"), max_size=4)),
    "extra_poprun_args": as_json_text(st.lists(text_or(*FLAGS), max_size=3)),
    "extra_env": as_json_text(env_map()),
    "secret_env": as_json_text(env_map()),
    "poprun": text_or("poprun", CPU_POPRUN, "/opt/poprun/bin/poprun"),
    "launch_host": text_or("localhost", "10.0.0.1"),
    "remote_state_dir": text_or("/tmp/ringflow jobs", "state", ".ringflow/jobs"),
    "ringflow_job": _bool_or_text(),
    "poll_interval": st.one_of(st.floats(), text_or("10", "0.5")),
    "lease_timeout": st.one_of(st.floats(), text_or("60", "none")),
    "on_existing": text_or("reattach", "restart"),
    "deferrable": _bool_or_text(),
}


# -- what the seed's poprun gets ---------------------------------------------------------------

def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def local_exports(config: PopRunConfig, ringflow_job: bool) -> list[str]:
    """--mpi-local-args as tokens: the composition's variables, extra_env's (secret ones
    bare), secret_env's bare, the job's token bare and its id."""
    endpoints = ",".join(f"{h}:{config.endpoint_port}" for h in config.hosts)
    items = [f"POPART_LOG_LEVEL={config.popart_log_level}"] if config.popart_log_level else []
    items += [f"PADDLE_TRAINERS_NUM={config.num_instances}",
              f"PADDLE_TRAINER_ENDPOINTS={endpoints}"]
    items += [name if is_hidden(name, value) else f"{name}={value}"
              for name, value in (config.extra_env or {}).items()]
    items += list(config.secret_env or {})
    if ringflow_job:
        items += ["RINGFLOW_JOB_TOKEN", f"RINGFLOW_JOB_ID={composed.JOB_ID}"]
    return [token for item in items for token in ("-x", item)]


def instance_exports(config: PopRunConfig, index: int) -> list[str]:
    host = config.hosts[index // config.nproc_per_host]
    return ["-x", f"PADDLE_TRAINER_ID={index}", "-x",
            f"PADDLE_CURRENT_ENDPOINT={host}:{config.endpoint_port}",
            "-x", f"PADDLE_RANK_IN_NODE={index % config.nproc_per_host}"]


def seed_argv(config: PopRunConfig, ringflow_job: bool) -> list[str]:
    """poprun's argv as Paddle's IPUController composes it (reference 5.5), with the
    operator's secret slots (bare `-x NAME`) and the job's variables."""
    argv = [config.poprun, f"--num-instances={config.num_instances}",
            f"--num-replicas={config.num_replicas}",
            f"--ipus-per-replica={config.ipus_per_replica}",
            f"--host={','.join(config.hosts)}", f"--vipu-partition={config.ipu_partition}",
            f"--vipu-server-host={config.vipu_server}",
            f"--update-partition={_yes_no(config.update_partition)}",
            f"--vipu-server-timeout={config.vipu_server_timeout}",
            f"--print-topology={_yes_no(config.print_topology)}",
            f"--numa-aware={_yes_no(config.numa_aware)}"]
    if config.mpi_global_args:
        argv.append("--mpi-global-args=" + " ".join(config.mpi_global_args))
    argv.append("--mpi-local-args=" + " ".join(local_exports(config, ringflow_job)))
    argv += [f"--instance-mpi-local-args={i}:" + " ".join(instance_exports(config, i))
             for i in range(config.num_instances)]
    argv += [*(config.extra_poprun_args or []), config.python, config.training_script,
             *config.training_script_args]
    if config.poprun == CPU_POPRUN:
        argv = [config.python, "-m", "ringflow.poprun", *argv[1:]]
    return argv


# -- the checks --------------------------------------------------------------------------------

def check_refusal(message: str, values: dict) -> None:
    """A refused configuration names every argument that is wrong on its own, or, when only
    a rule across arguments fails, one of those."""
    wrong = []
    for name in FIELD_NAMES:
        if name in values:
            try:
                validate_field(name, values[name])
            except ValueError:  # pydantic's ValidationError is one
                wrong.append(name)
    if wrong:
        missing = [name for name in wrong if f"{name}:" not in message]
        assert not missing, f"{missing} not named in {message!r}"
    else:
        assert any(name in message for name in FIELD_RULES_ACROSS), message


def check_values_land_unchanged(config: PopRunConfig, values: dict) -> None:
    """Text fields reach the command as given (hosts only lose the spaces around names)."""
    for name in ("ipu_partition", "vipu_server", "training_script", "python", "poprun"):
        if isinstance(values.get(name), str):
            assert getattr(config, name) == values[name], name
    args = values.get("training_script_args")
    if args is not None:
        assert config.training_script_args == (json.loads(args) if isinstance(args, str)
                                               else args)


def check_start_command(sent, op: PopRunOperator, config: PopRunConfig, argv: list[str],
                        launch_host: str) -> None:
    """The launch host's shell text is the skeleton with the values in one word each:
    the exports are exactly poprun's plain variables and the job's own."""
    assert [s.host for s in sent] == [launch_host]
    task = TaskKey("d", "p", "r", 1)
    state = op.remote_state_dir or DEFAULT_STATE
    env = dict(config.plain_env())
    if config.poprun == CPU_POPRUN:
        env["PYTHONPATH"] = SHIPPED
    env.update({"RINGFLOW_JOB_ID": composed.JOB_ID, "RINGFLOW_TASK": task.key,
                "PYTHONPATH": SHIPPED})
    secret_names = [*config.hidden_env(), *(["RINGFLOW_JOB_TOKEN"] if "RINGFLOW_JOB_TOKEN"
                                             in sent[0].stdin else [])]
    # the state folder's parts each a placeholder: the command `own`s each part in turn
    state_parts = state.split("/")
    placed_state = "/".join(f"PHSTATE{i}X" if part else ""
                            for i, part in enumerate(state_parts))
    values = {"PHPYTHONX": config.python}
    values.update({f"PHSTATE{i}X": part for i, part in enumerate(state_parts) if part})
    values.update({f"PHARGV{i}X": token for i, token in enumerate(argv)})
    values.update({f"PHENVNAME{i}X": name for i, name in enumerate(env)})
    values.update({f"PHENVVALUE{i}X": str(value) for i, value in enumerate(env.values())})
    values.update({f"PHSECRET{i}X": name for i, name in enumerate(secret_names)})
    skeleton = commands.start_command(
        Runtime("PHPYTHONX", SHIPPED), f"{placed_state}/{task.key}/try-1",
        [f"PHARGV{i}X" for i in range(len(argv))],
        env={f"PHENVNAME{i}X": f"PHENVVALUE{i}X" for i in range(len(env))}, secrets="env",
        lease_timeout=op.lease_timeout, grace_s=KILL_GRACE_S, handle={"PHHANDLEX": 1},
        secret_names=[f"PHSECRET{i}X" for i in range(len(secret_names))])
    got, want = remote_words(sent[0].command), remote_words(skeleton)
    handle = json.dumps({"PHHANDLEX": 1})
    at = want.index(handle)
    assert at < len(got), "the shell text is shorter than the skeleton"
    handle_word = values[handle] = got[at]
    same_shape(got, want, values, not_options=("PHSTATE0X",))
    record = json.loads(handle_word)
    assert record["extra"]["launch_host"] == launch_host
    stdin = json.loads(sent[0].stdin)
    assert set(stdin[ENV_KEY]) == set(secret_names)


def check_poprun_splits(argv: list[str], config: PopRunConfig, ringflow_job: bool) -> None:
    """poprun hands --mpi-global-args and --mpi-local-args to mpirun split at whitespace:
    each value stays one token, so no `-x` or option is added."""
    local = next(t for t in argv if t.startswith("--mpi-local-args="))
    assert local.partition("=")[2].split() == local_exports(config, ringflow_job)
    if config.mpi_global_args:
        given = next(t for t in argv if t.startswith("--mpi-global-args="))
        # an empty item is no token at all (nothing added)
        assert given.partition("=")[2].split() == [a for a in config.mpi_global_args if a]


def check_cpu_poprun(argv: list[str], config: PopRunConfig, ringflow_job: bool) -> None:
    """ringflow-poprun reads the command line as composed, and mpirun runs the training
    script in every instance with exactly the expected variables."""
    try:
        args = parse_poprun_args(argv[3:])
    except ConfigError as exc:  # a flag of the user's that the CPU poprun does not know
        flags = [f.partition("=")[0] for f in config.extra_poprun_args or []]
        assert flags and any(repr(f) in str(exc) or f in str(exc) for f in flags), str(exc)
        return
    program = [config.python, config.training_script, *config.training_script_args]
    assert args.program == program
    assert args.hosts == tuple(config.hosts)
    assert (args.num_instances, args.replicas) == (config.num_instances, config.num_replicas)
    assert args.mpi_global_args == tuple(a for a in config.mpi_global_args or () if a)
    mpirun = poprun_mpirun_argv(args, {}, as_root=False)
    contexts = _contexts(mpirun, len(program), config.num_instances)
    plain = {n.partition("=")[0] for n in local_exports(config, ringflow_job) if n != "-x"}
    for index, (options, tail) in enumerate(contexts):
        assert tail == ["sh", "-c", INSTANCE_SH, INSTANCE_NAME, *program]
        names = exported_names(options)
        popdist = {n for n in names if n.startswith(("POPDIST_", "IPUOF_VIPU_API_"))}
        assert names - popdist == plain | {"PADDLE_TRAINER_ID", "PADDLE_CURRENT_ENDPOINT",
                                           "PADDLE_RANK_IN_NODE",
                                           "RINGFLOW_REPORT_EXIT_TIME"}, index


def _contexts(mpirun: list[str], program_len: int, count: int):
    """mpirun's app contexts as (options, the sh and its program), read from the end of
    each: a program's own `:` would show as a context too many."""
    tail_len = 4 + program_len
    at = mpirun.index("-np")
    contexts = []
    while at < len(mpirun):
        sh = mpirun.index("sh", at)
        while mpirun[sh + 1:sh + 3] != ["-c", INSTANCE_SH]:
            sh = mpirun.index("sh", sh + 1)
        contexts.append((mpirun[at:sh], mpirun[sh:sh + tail_len]))
        at = sh + tail_len
        if at < len(mpirun):
            assert mpirun[at] == ":", f"after context {len(contexts)}: {mpirun[at:at + 3]}"
            at += 1
    assert len(contexts) == count
    return contexts


@contextlib.contextmanager
def known_ids():
    """The job's id and token as known values, so the expected argv is exact; the hosts
    recording; an ssh_default connection (its password is looked up, never used)."""
    mp = pytest.MonkeyPatch()
    composed.known_identity(mp, poprun_module, TOKEN)
    mp.setattr(poprun_module, "SSHLauncher",
               lambda hosts, **kw: recording_launcher("ssh", hosts, **kw))
    composed.ssh_connections(mp, "SSH_DEFAULT")
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def fixed_ids():
    with known_ids():
        yield


BASE = {"hosts": ["localhost"], "nproc_per_host": 1, "ipus_per_replica": 1, "num_ipus": 12,
        "ipu_partition": "pod16", "vipu_server": "127.0.0.1", "training_script": "train.py"}


@PROPERTY_SETTINGS
@given(values=mostly_valid(VALID, HOSTILE))
# what the property found: a ValueError from the operator's __init__; a launch_host or a
# field validated alone refused without its name; $(id) run by the host's shell; a ':'
# that made mpirun start a program of its own
@example(values={**BASE, "deferrable": "maybe"})
@example(values={**BASE, "launch_host": ";"})
@example(values={**BASE, "hosts": ["{{ params.x }}"], "num_ipus": 0})
@example(values={**BASE, "remote_state_dir": "$(id)"})
@example(values={**BASE, "remote_state_dir": "-x"})
@example(values={**BASE, "poprun": CPU_POPRUN,
                 "training_script_args": [":", "-np", "1", "sh", "-c", "id"]})
@example(values={**BASE, "poprun": CPU_POPRUN, "mpi_global_args": [":", "sh", ":"]})
@example(values={**BASE, "mpi_global_args": [""]})
@example(values={**BASE, "extra_env": {"FOO\n": "1"}})
@example(values={**BASE, "extra_env": {"FOO": "1\n"}})
@example(values={**BASE, "secret_env": {"PATH": "1"}})
@example(values={**BASE, "mpi_global_args": [""], "poprun": CPU_POPRUN})
def test_poprun_operator_arguments_are_refused_by_name_or_add_nothing(fixed_ids, values):
    given_values = dict(values)
    try:
        op = PopRunOperator(task_id="p", preflight=False, **values)
    except RingflowConfigException as exc:
        _check_operator_refusal(str(exc), given_values)
        return
    check_operator(op, given_values)


def check_operator(op: PopRunOperator, given_values: dict) -> None:
    """Run `execute` up to the start of the job: refused naming the argument, or the
    commands sent add nothing (`given_values`: the arguments as the operator got them)."""
    context = {"ti": TaskInstanceStub("d", "p", run_id="r")}
    sent = None
    try:
        summary = op.execute(context)
    except RingflowConfigException as exc:  # a value checked when the task runs
        _check_operator_refusal(str(exc), given_values)
        return
    except Composed as stopped:
        sent = stopped.sent
    else:
        assert op.dry_run is True and summary["dry_run"] is True, summary
    config = parse_config({n: given_values[n] for n in FIELD_NAMES if n in given_values})
    check_values_land_unchanged(config, given_values)
    ringflow_job = op._flag("ringflow_job", op.ringflow_job)
    argv = seed_argv(config, ringflow_job)
    launch_host = (op.launch_host or "").strip() or config.hosts[0]
    if sent is None:  # dry_run: the argv it shows is the one it would send
        assert len(summary["argv"]) == len(argv)
    else:
        check_start_command(sent, op, config, argv, launch_host)
    check_poprun_splits(argv, config, ringflow_job)
    if config.poprun == CPU_POPRUN:
        check_cpu_poprun(argv, config, ringflow_job)


def _check_operator_refusal(message: str, values: dict) -> None:
    names = [n for n in (*FIELD_NAMES, "launch_host", "remote_state_dir", "ringflow_job",
                         "deferrable",
                         "poll_interval", "lease_timeout", "on_existing") if n in message]
    assert names, f"no argument named in {message!r}"
    config_values = {n: values[n] for n in FIELD_NAMES if n in values}
    try:
        parse_config(config_values)
    except ConfigError as exc:
        check_refusal(str(exc), config_values)
