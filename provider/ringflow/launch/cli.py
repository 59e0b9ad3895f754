"""Command lines: `ringflow launch ...` (console script) and `python -m ringflow.launch ...`.

User errors (ConfigError) print one line and exit 2, with no traceback; a job's exit code is
its root cause's (the first failing rank's code, 128+N for signal N).
"""

from __future__ import annotations

import os
import sys

from ringflow.errors import ConfigError, LaunchError
from ringflow.launch.agent import Agent
from ringflow.launch.config import LaunchConfig, parse_launch_args
from ringflow.launch.env import JobIdentity, resolve_identity
from ringflow.launch.logs import Console
from ringflow.launch.stdin import STDIN_FD, StdinWatch, read_secrets

USAGE = """usage: ringflow launch [options] script.py|-m module [args]
       ringflow train SPEC.json
       ringflow evaluate CHECKPOINT [--data PATH]
       ringflow generate CHECKPOINT --prompt TEXT [options]

commands:
  launch    start this host's ranks of a job (see `ringflow launch --help`)
  train     run a training job spec in this one process (see `ringflow train --help`)
  evaluate  a checkpoint's validation loss, one JSON line (see `ringflow evaluate --help`)
  generate  text sampled from a transformer checkpoint (see `ringflow generate --help`)
"""


def launch_main(argv: list[str] | None = None, prog: str = "python -m ringflow.launch") -> int:
    """Parse, validate, run one agent; returns the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        config = parse_launch_args(args, prog=prog)
        environ = dict(os.environ)
        if config.stdin:  # the secrets take part in the identity as if they were exported
            environ.update(read_secrets(STDIN_FD, config.stdin_timeout_s))
        identity, warning = resolve_identity(environ)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return _run(config, identity, warning, environ)


def _run(config: LaunchConfig, identity: JobIdentity, warning: str | None,
         environ: dict[str, str]) -> int:
    console = Console(sys.stdout.buffer)
    if warning:
        console.info(f"warning: {warning}")
    lifeline = StdinWatch(STDIN_FD) if config.stdin else None
    try:
        result = Agent(config, identity, console, environ, lifeline).run()
    except LaunchError as exc:
        console.info(f"error: {exc}")
        return 1
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    """The `ringflow` console script: subcommand dispatch."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        stream = sys.stdout if args else sys.stderr
        print(USAGE, file=stream, end="")
        return 0 if args else 2
    if args[0] == "train":
        from ringflow.train.__main__ import main as train_main

        return train_main(args[1:], prog="ringflow train")
    if args[0] in ("evaluate", "generate"):
        import importlib

        module = importlib.import_module(f"ringflow.{args[0]}")
        return module.main(args[1:], prog=f"ringflow {args[0]}")
    if args[0] != "launch":
        print(f"ringflow: error: unknown command {args[0]!r}; expected 'launch', 'train', "
              f"'evaluate' or 'generate'", file=sys.stderr)
        return 2
    return launch_main(args[1:], prog="ringflow launch")


if __name__ == "__main__":
    sys.exit(main())
