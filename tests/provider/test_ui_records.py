"""The training views' reading of task log records (ringflow_provider.plugins.records) and
the fields a progress line's record carries (launchers.lines.log_fields); plain data, no
Airflow services. That the records really carry them in Airflow's task logs, attached and
deferred, the e2e tests show (tests/e2e/test_training_ui.py)."""

from __future__ import annotations

import subprocess
import sys

from ringflow.launch.lines import Line
from ringflow_provider.launchers.lines import log_fields, read_line
from ringflow_provider.plugins import records

METRIC = ('[rank 0] [train] metric {"step": 40, "loss": 0.4132, "lr": 0.001, '
          '"samples_per_s": 1850.5, "elapsed_s": 3.2}')


def whole(text: str) -> Line:
    """`text` as a whole line of its stream (only a whole line can be a machine line)."""
    return Line(text, whole=True)


def test_a_metric_lines_record_carries_step_loss_lr_and_samples_per_s():
    assert log_fields(read_line("stdout", whole(METRIC), None)) == {
        "step": 40, "loss": 0.4132, "lr": 0.001, "samples_per_s": 1850.5}
    # the same text as a piece that is no whole line is shown, never read
    assert log_fields(read_line("stdout", Line(METRIC), None)) == {}


def test_other_lines_and_other_ranks_metric_lines_carry_no_fields():
    assert log_fields(read_line("stdout", whole("[rank 0] [train] building the model"),
                                None)) == {}
    assert log_fields(read_line("stdout", whole(METRIC.replace("rank 0", "rank 1")),
                                None)) == {}
    assert log_fields(read_line(
        "stdout", whole('[rank 0] [train] metric {"step": 1, "loss": true}'),
        None)) == {"step": 1}


def test_progress_points_come_from_the_records_fields_by_step_once_each():
    logged = [
        {"event": "training transformer on this host", "level": "info"},
        {"event": "step 5/10  loss 2.0000", "step": 5, "loss": 2.0, "lr": 0.001},
        {"event": "step 1/10  loss 3.0000", "step": 1, "loss": 3.0, "lr": 0.001,
         "samples_per_s": 700.0},
        {"event": "step 5/10  loss 2.0000", "step": 5, "loss": 2.0, "lr": 0.001,
         "samples_per_s": 800.0},                    # read again by a second watch
        {"event": "step 10 text only"},              # prose is not parsed
        {"event": "x", "step": True, "loss": 1.0},   # not a step
        {"event": "x", "step": 7, "loss": float("nan")},
    ]
    assert records.progress_points(logged) == [
        {"step": 1, "loss": 3.0, "lr": 0.001, "samples_per_s": 700.0},
        {"step": 5, "loss": 2.0, "lr": 0.001, "samples_per_s": 800.0}]


def test_resume_step_and_failure_of_a_try():
    logged = [{"event": "try 2: resuming from step 120 (checkpoint /c/step-120)",
               "resume_step": 120},
              {"event": "Task failed with exception", "error_detail": [
                  {"exc_type": "RingflowJobFailedException",
                   "exc_value": "rank 1 on n2 failed (exit code 1): CommError: peer lost"},
                  {"exc_type": "OSError", "exc_value": "the cause, chained"}]}]
    assert records.resume_step(logged) == 120
    assert records.failure(logged) == ("RingflowJobFailedException: rank 1 on n2 failed "
                                       "(exit code 1): CommError: peer lost")
    assert records.resume_step(logged[1:]) is None
    assert records.failure(logged[:1]) is None


def test_the_operator_and_the_plugin_load_without_the_api_servers_parts():
    """A worker imports the operator (its extra link included) and loads plugins; neither
    may need FastAPI or Airflow's api-server modules, which only the api-server uses."""
    code = ("import sys\n"
            "import ringflow_provider.operators.tp_train\n"
            "from ringflow_provider.plugins.plugin import RingflowPlugin\n"
            "views = RingflowPlugin().external_views\n"
            "print(sorted(m for m in sys.modules if m.startswith(('fastapi', "
            "'airflow.api_fastapi', 'ringflow_provider.plugins.app', "
            "'ringflow_provider.plugins.data'))))\n"
            "print(sorted(v['name'] for v in views))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "['Training', 'Training runs']"]
