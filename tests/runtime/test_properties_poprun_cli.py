"""Property: whatever command line `ringflow-poprun` gets (generated ones: its flags
with valid and hostile values, unknown flags, programs and their arguments made of shell
metacharacters, `:`, dashes, unicode), it is refused with a ConfigError that names the flag
or the program, or mpirun's command adds nothing: one app context per instance, each running
exactly the given program under the exit-reporting sh, with exactly the variables its
options, poprun's POPDIST_* and ringflow's own export.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ringflow.errors import ConfigError
from ringflow.launch.openmpi import (
    INSTANCE_NAME,
    INSTANCE_SH,
    PASS_THROUGH,
    REPORT_EXIT_VAR,
    exported_names,
)
from ringflow.poprun import parse_poprun_args
from ringflow.poprun.args import HelpRequested
from ringflow.poprun.mpirun import mpirun_argv
from tests.hostile import PIECES, PROPERTY_SETTINGS, hostile_text, text_or

pytestmark = pytest.mark.slow

ENVIRON = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/opt/rt", "RINGFLOW_JOB_ID": "j1"}
_COUNT = st.one_of(st.sampled_from(["1", "2", "4"]), text_or("2", "0", "-1", "x"))
_EXPORTS = st.lists(st.sampled_from(["-x A=1", "-x B", "-x PADDLE_TRAINERS_NUM=2",
                                     "-x E=$(id)", "--bind-to none", "-x C=a:b"]),
                    max_size=3).map(" ".join)
_OPTION = st.one_of(
    st.tuples(st.sampled_from(["--num-instances", "--num-replicas", "--ipus-per-replica",
                               "--only-output-from-instance"]), _COUNT),
    st.tuples(st.sampled_from(["--host", "-H"]), st.one_of(
        st.sampled_from(["localhost", "h1,h2", "10.0.0.1,10.0.0.2"]),
        text_or("h1", "h1,h2"))),
    st.tuples(st.sampled_from(["--mpi-local-args", "--mpi-global-args"]),
              st.one_of(_EXPORTS, hostile_text())),
    st.tuples(st.just("--instance-mpi-local-args"),
              st.tuples(st.sampled_from(["0", "1", "x"]), _EXPORTS).map(":".join)),
    st.tuples(st.sampled_from(["--print-topology", "--numa-aware", "--offline-mode"]),
              text_or("yes", "no")),
    st.tuples(st.sampled_from(["--vipu-partition", "--vipu-server-host", "--vipu-cluster"]),
              text_or("pod16", "10.0.0.9")),
    st.tuples(text_or("--unknown", "--num-instance", "-q"), text_or("1")),
)
_PROGRAM = st.lists(st.one_of(st.sampled_from(["python3", "train.py", "-m", "--lr", "0.1",
                                               ":", "--", "-"]),
                              st.sampled_from(PIECES), hostile_text()),
                    min_size=0, max_size=4)


@st.composite
def command_lines(draw) -> list[str]:
    """poprun's options (`--flag=value` or `--flag value`), then maybe `--`, the program."""
    argv: list[str] = []
    for flag, value in draw(st.lists(_OPTION, max_size=5)):
        argv += [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]
    if draw(st.booleans()):
        argv.append("--")
    program = draw(st.one_of(st.just(["python3", "train.py"]), _PROGRAM))
    return argv + program


def _contexts(mpirun: list[str], program: list[str]) -> list[list[str]]:
    """mpirun's app contexts, each up to and with its sh and program (read from its end, so
    a `:` inside a program shows as a context too many or a wrong program)."""
    tail = ["sh", "-c", INSTANCE_SH, INSTANCE_NAME, *program]
    contexts, at = [], mpirun.index("-np")
    while at < len(mpirun):
        end = next(i for i in range(at, len(mpirun)) if mpirun[i:i + len(tail)] == tail)
        contexts.append(mpirun[at:end])
        at = end + len(tail)
        if at < len(mpirun):
            assert mpirun[at] == ":", f"after context {len(contexts)}: {mpirun[at:at + 4]}"
            at += 1
    return contexts


@PROPERTY_SETTINGS
@given(argv=command_lines())
@example(argv=["--mpi-local-args", "-x", "python3", "train.py"])
def test_a_command_line_is_refused_by_name_or_runs_only_its_program(argv):
    try:
        args = parse_poprun_args(argv)
        mpirun = mpirun_argv(args, ENVIRON, as_root=False)
    except HelpRequested:  # pragma: no cover - no -h is generated
        raise AssertionError("help was not asked for") from None
    except ConfigError as exc:
        message = str(exc)
        named = [t.partition("=")[0] for t in argv if t.startswith("-")]
        assert any(name in message or repr(name) in message
                   for name in (*named, "program", "--num-instances")), (message, argv)
        return
    assert ":" not in args.program
    base = mpirun[:mpirun.index("-np")]
    assert base == ["mpirun", "--tag-output", "--bind-to", "none", *args.mpi_global_args]
    contexts = _contexts(mpirun, list(args.program))
    assert len(contexts) == args.num_instances
    for index, options in enumerate(contexts):
        host = args.host_of(index)
        assert options[:4] == ["-np", "1", "-H", f"{host}:{args.per_host}"]
        given = [*args.mpi_local_args, *args.instance_mpi_local_args.get(index, ())]
        assert options[4:4 + len(given)] == given
        rest = options[4 + len(given):]
        assert all(flag == "-x" for flag in rest[::2]), rest
        ours = {item.partition("=")[0] for item in rest[1::2]}
        popdist = {n for n in ours if n.startswith(("POPDIST_", "IPUOF_VIPU_API_"))}
        assert ours - popdist <= {*PASS_THROUGH, "RINGFLOW_JOB_ID", REPORT_EXIT_VAR}
        assert exported_names(options) == exported_names(given) | ours


@pytest.mark.parametrize("argv", [
    ["python3", "train.py", ":", "-np", "1", "-H", "evil:1", "sh", "-c", "id"],
    ["--mpi-global-args=: -np 1 sh -c id :", "python3", "train.py"],
    ["--mpi-local-args=-x A=1 : -np 1 sh -c id :", "python3", "train.py"],
    ["--instance-mpi-local-args=0:-x A=1 : sh -c id :", "python3", "train.py"],
])
def test_a_colon_token_that_would_start_another_program_is_refused(argv):
    """Open MPI's mpirun reads a `:` token anywhere on its command line as the start of
    another app context: one in a program's arguments or in the mpirun options would run
    a command of its own on any host."""
    with pytest.raises(ConfigError, match="':'"):
        mpirun_argv(parse_poprun_args(argv), ENVIRON, as_root=False)


def test_mpi_options_split_as_a_shell_does():
    args = parse_poprun_args(["--mpi-local-args=-x 'A=a b'", "python3", "t.py"])
    assert args.mpi_local_args == tuple(shlex.split("-x 'A=a b'"))
