"""PopRun command composition: pure functions from a PopRunConfig to poprun's argv.

The argv equals, token for token, what Paddle's IPUController shell string delivers to
`poprun` after shell word-splitting (reference 5.5); the string for a remote shell is that
argv quoted token by token, so no field value can add a shell command. No Airflow import
(the secret-name rule, `jobs.masking`, asks Airflow's masker only when called).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from ringflow.errors import ConfigError
from ringflow_provider.jobs.masking import (
    MASK,
    MIN_MASKED_LEN,
    Secrets,
    mask_text,
    secret_env_values,
)
from ringflow_provider.poprun.models import (
    FIELD_NAMES,
    RESERVED_ENV,
    PopRunConfig,
    validate_field,
)

__all__ = [
    "FIELD_NAMES",
    "MASK",
    "MIN_MASKED_LEN",
    "PopRunConfig",
    "build_poprun_argv",
    "config_error_message",
    "launch_argv",
    "mask_argv",
    "mask_text",
    "parse_config",
    "render_poprun_command",
    "secret_env_values",
    "secret_values",
    "validate_field",
]

def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _endpoints(config: PopRunConfig) -> list[str]:
    # One endpoint per HOST, as the seed composes them (not one per instance).
    return [f"{host}:{config.endpoint_port}" for host in config.hosts]


def _mpi_local_args(config: PopRunConfig, endpoints: list[str], bare: Collection[str]) -> str:
    exports = []
    if config.popart_log_level:
        exports.append(f"POPART_LOG_LEVEL={config.popart_log_level}")
    exports.append(f"PADDLE_TRAINERS_NUM={config.num_instances}")
    exports.append(f"PADDLE_TRAINER_ENDPOINTS={','.join(endpoints)}")
    exports.extend(name if name in bare else f"{name}={value}"
                   for name, value in (config.extra_env or {}).items())
    return " ".join(f"-x {item}" for item in exports)


def _instance_args(config: PopRunConfig, endpoints: list[str]) -> list[str]:
    """One `--instance-mpi-local-args` per instance; instances fill hosts in contiguous blocks."""
    out = []
    for idx in range(config.num_instances):
        endpoint = endpoints[idx // config.nproc_per_host]
        rank_in_node = idx % config.nproc_per_host
        out.append(
            f"--instance-mpi-local-args={idx}:-x PADDLE_TRAINER_ID={idx} "
            f"-x PADDLE_CURRENT_ENDPOINT={endpoint} -x PADDLE_RANK_IN_NODE={rank_in_node}"
        )
    return out


def build_poprun_argv(config: PopRunConfig, bare: Collection[str] = ()) -> list[str]:
    """poprun's argv (argv[0] is the executable), in the seed's flag order. The extra_env
    variables named in `bare` get a bare `-x NAME` slot (see `launch_argv`); without it the
    argv is the seed's."""
    endpoints = _endpoints(config)
    argv = [
        config.poprun,
        f"--num-instances={config.num_instances}",
        f"--num-replicas={config.num_replicas}",
        f"--ipus-per-replica={config.ipus_per_replica}",
        f"--host={','.join(config.hosts)}",
        f"--vipu-partition={config.ipu_partition}",
        f"--vipu-server-host={config.vipu_server}",
        f"--update-partition={_yes_no(config.update_partition)}",
        f"--vipu-server-timeout={config.vipu_server_timeout}",
        f"--print-topology={_yes_no(config.print_topology)}",
        f"--numa-aware={_yes_no(config.numa_aware)}",
    ]
    if config.mpi_global_args:
        argv.append(f"--mpi-global-args={' '.join(config.mpi_global_args)}")
    argv.append(f"--mpi-local-args={_mpi_local_args(config, endpoints, bare)}")
    argv.extend(_instance_args(config, endpoints))
    argv.extend(config.extra_poprun_args or [])
    argv.append(config.python)
    argv.append(config.training_script)
    argv.extend(config.training_script_args)
    return argv


def launch_argv(config: PopRunConfig, secret: Iterable[str] = (),
                plain: Mapping[str, str] | None = None) -> list[str]:
    """The argv sent to the launch host: `build_poprun_argv`'s with a bare `-x NAME` for
    every variable whose value is secret (extra_env's under secret names in their places,
    then secret_env's and `secret`'s at the end of --mpi-local-args), then `-x NAME=VALUE`
    for each `plain` variable. mpirun exports a bare `-x NAME` with the value of its own
    environment, which the launch script set from the SSH channel's stdin: so no secret
    value is on poprun's (or any) command line. ringflow-poprun takes every bare `-x NAME`
    for a secret and hands it to each host over SSH instead, never through Open MPI's own
    clear TCP (`ringflow.launch.secret_drop`)."""
    hidden = [*(config.secret_env or {}), *secret]
    plain = dict(plain or {})
    taken = set(RESERVED_ENV) | set(config.extra_env or {}) | set(hidden)
    clash = sorted(taken & set(plain))
    if clash:
        raise ConfigError(f"{', '.join(clash)} would be in poprun's -x list twice")
    argv = build_poprun_argv(config, bare=config.secret_env_names())
    at = next(i for i, token in enumerate(argv) if token.startswith("--mpi-local-args="))
    argv[at] = " ".join([argv[at], *(f"-x {name}" for name in hidden),
                         *(f"-x {name}={value}" for name, value in plain.items())])
    return argv


def render_poprun_command(config: PopRunConfig) -> str:
    """The argv as one POSIX shell string: `shlex.split(result) == build_poprun_argv(config)`."""
    return shlex.join(build_poprun_argv(config))


def secret_values(config: PopRunConfig, extra: Iterable[str | None] = ()) -> list[str]:
    """Values to mask: extra_env values under secret names (jobs.masking's rule), every
    secret_env value, plus `extra` (passwords, the job token). A value shorter than
    MIN_MASKED_LEN is not masked wherever it occurs (as in Airflow's masker); the argv sent
    (`launch_argv`) has no slot for any of them to show in."""
    found = Secrets().add_env(config.extra_env or {})
    found.add_env(config.secret_env or {}, all_secret=True).add(*extra)
    return found.values  # longest first, so a secret that contains another is masked whole


def mask_argv(argv: list[str], secrets: Iterable[str],
              secret_names: Iterable[str] = ()) -> list[str]:
    """argv with the secrets replaced by ***, and the value of `-x NAME=value` for each
    secret name, whatever its length."""
    secrets = list(secrets)
    slots = [re.compile(rf"(-x {re.escape(name)}=)\S*") for name in secret_names]
    masked = []
    for token in argv:
        token = mask_text(token, secrets)
        if token.startswith("--mpi-local-args="):
            for slot in slots:
                token = slot.sub(lambda m: m.group(1) + MASK, token)
        masked.append(token)
    return masked


def config_error_message(exc: ValidationError, field: str | None = None) -> str:
    """One line per failing field: where, what was expected, what came. `field`: the one
    field that was validated alone (its errors have no field in their place)."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(part) for part in ([field] if field else []) + list(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown argument"
        # Our own checks name the value already; pydantic's type errors do not.
        detail = "" if err["type"] == "value_error" else f" (got {err.get('input')!r})"
        lines.append(f"{where}: {msg}{detail}" if where else msg)
    return "invalid PopRun configuration: " + "; ".join(lines)


def parse_config(values: Mapping[str, Any]) -> PopRunConfig:
    """Validate a mapping into a PopRunConfig, raising ConfigError with a readable message."""
    try:
        return PopRunConfig.model_validate(dict(values))
    except ValidationError as exc:
        raise ConfigError(config_error_message(exc)) from None
