"""PopRun for PopRunOperator: the validated job (`models.PopRunConfig`) and the pure
composition of poprun's command line from it (`compose`), as Paddle's IPU launch controller
composes it; the operator's arguments checked into it (`arguments`); what the task reports
and how a job's end becomes the task's outcome (`outcome`, `report`: the one module here
that raises Airflow's exceptions)."""

from ringflow_provider.poprun.compose import (
    FIELD_NAMES,
    MASK,
    MIN_MASKED_LEN,
    PopRunConfig,
    build_poprun_argv,
    config_error_message,
    launch_argv,
    mask_argv,
    mask_text,
    parse_config,
    render_poprun_command,
    secret_env_values,
    secret_values,
    validate_field,
)

__all__ = ["FIELD_NAMES", "MASK", "MIN_MASKED_LEN", "PopRunConfig", "build_poprun_argv",
           "config_error_message", "launch_argv", "mask_argv", "mask_text", "parse_config",
           "render_poprun_command", "secret_env_values", "secret_values", "validate_field"]
