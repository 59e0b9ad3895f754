"""`ringflow.launch.exits`: the one wording of how a process ended and the one rule for which
failure came first, which the agent, the mpirun job (ringflow-poprun, the mpirun launcher)
and the provider report with."""

from __future__ import annotations

import io

import pytest

from ringflow.launch.exits import describe_exit, describe_signal, failure_order, shell_exit_code
from ringflow.launch.lines import Line
from ringflow.launch.processes import describe_returncode
from ringflow.poprun import PopRunJob, parse_poprun_args


@pytest.mark.parametrize(("code", "text"), [
    (0, "exit code 0"),
    (1, "exit code 1"),
    (2, "exit code 2"),
    (128, "exit code 128"),
    (129, "exit code 129 (128+1: SIGHUP)"),
    (137, "exit code 137 (128+9: SIGKILL)"),
    (143, "exit code 143 (128+15: SIGTERM)"),
    (160, "exit code 160 (128+32: signal 32)"),  # glibc's own: no name in Python
    (193, "exit code 193"),  # past the last signal: a plain code
    (255, "exit code 255"),
    # Popen style: the process was seen to die by the signal
    (-9, "killed by SIGKILL (exit code 137)"),
    (-15, "killed by SIGTERM (exit code 143)"),
    (-1, "killed by SIGHUP (exit code 129)"),
])
def test_an_exit_status_is_described_one_way(code, text):
    assert describe_exit(code) == text


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (137, 137), (-9, 137),
                                                  (-15, 143)])
def test_a_popen_return_code_becomes_the_shells_exit_code(returncode, code):
    assert shell_exit_code(returncode) == code
    assert describe_returncode(returncode) == (code, describe_exit(returncode))


def test_a_signal_is_named_with_its_number():
    assert describe_signal(9) == "signal 9 (SIGKILL)"
    assert describe_signal(32) == "signal 32"


# (after_peer_failure, began_exit_at, index) of each failure; the index of the root cause
FAILURE_CASES = {
    "the earliest by the clock": ([(False, 12.5, 0), (False, 12.1, 1), (False, 12.3, 2)], 1),
    "one that saw a peer fail comes last, even when earlier": (
        [(True, 10.0, 0), (False, 11.0, 1)], 1),
    "all saw a peer fail: the earliest of them": ([(True, 10.5, 0), (True, 10.2, 1)], 1),
    "an unknown time comes after every known one": ([(False, None, 0), (False, 99.0, 3)], 3),
    "a tie on the clock goes to the lower index": ([(False, 5.0, 4), (False, 5.0, 2)], 2),
    "nothing known: the lower index": ([(False, None, 7), (False, None, 6)], 6),
}


@pytest.mark.parametrize("case", FAILURE_CASES)
def test_the_root_cause_is_first_in_failure_order(case):
    failures, first = FAILURE_CASES[case]
    assert min(failures, key=lambda f: failure_order(*f))[2] == first
    assert sorted(failure_order(*f) for f in failures)[0][2] == first


def test_the_mpirun_job_names_the_instance_first_in_failure_order():
    """Instance 0 began to exit first but said it saw a peer fail: instance 2 is named."""
    job = PopRunJob(parse_poprun_args(["--num-instances=4", "--host=a,b", "p"]),
                    stdout=io.StringIO(), stderr=io.StringIO())
    joined = job._emitter("stderr", job.stderr)

    def emit(index: int, text: str) -> None:  # a whole line, as OutputJoiner passes it
        joined(index, Line(text.replace("NONCE", job._exit_nonce), True))

    emit(0, "ringflow-exit-time 1000.001 after-peer-failure")
    emit(0, "ringflow-poprun-exit NONCE 1 1000.090")
    emit(2, "ringflow-exit-time 1000.020")
    emit(2, "ringflow-poprun-exit NONCE 137 1000.080")
    emit(3, "ringflow-poprun-exit NONCE 1 1000.050")
    assert job._first_failure(1) == 137
    job._close_output()
    assert job.stdout.getvalue() == ("ringflow-poprun: instance 2 on b failed first with "
                                     "exit code 137 (128+9: SIGKILL); every instance was "
                                     "stopped\n")


def test_one_table_says_what_every_exit_code_ringflow_chooses_means():
    from ringflow.launch import agent, exits, follow
    from ringflow_provider.launchers import commands
    from ringflow_provider.tp_train import outcome

    assert sorted(exits.EXIT_CODES) == [0, 1, 2, 3, 4, 96, 97, 98, 129, 255]
    assert all(text and text == text.strip() for text in exits.EXIT_CODES.values())
    assert (agent.STDIN_CLOSED_EXIT, follow.LOST_EXIT, commands.RUNNING_EXIT) == (
        exits.STDIN_CLOSED_EXIT, exits.LOST_EXIT, exits.RUNNING_EXIT)
    assert sorted(outcome.NO_RETRY) == [2, 3, 4]
    assert outcome.NO_RETRY[exits.EXIT_CHECKPOINT].startswith(
        "a checkpoint could not be written")
