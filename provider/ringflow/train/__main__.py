"""``python -m ringflow.train SPEC.json``: one rank of a training job (the launcher starts
one per rank: ``python -m ringflow.launch --nproc-per-host N -m ringflow.train SPEC.json``;
``ringflow train SPEC.json`` runs a world of one in this process).

Exit codes (``ringflow.launch.exits.EXIT_CODES``): 0 trained (or nothing left to train),
2 a bad spec or a spec that does not fit the job's layout or checkpoint (one line
``prog: error: ...`` on stderr, no traceback), 3 a NaN/inf loss stopped the job, 4 a
checkpoint could not be written (the previous one is intact), 1 another ringflow error (a
peer died, ...).
"""

from __future__ import annotations

import sys

USAGE = """usage: {prog} SPEC.json

Runs one rank of the training job the JSON job spec describes (fields: see
ringflow.train.spec.FIELD_DOCS). Without the launcher's PADDLE_* variables it is a world
of one process.
"""


def main(argv: list[str] | None = None, prog: str = "python -m ringflow.train") -> int:
    from ringflow.errors import ConfigError, RingflowError
    from ringflow.launch.exits import EXIT_CONFIG, EXIT_ERROR

    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE.format(prog=prog), end="")
        return 0
    if len(args) != 1:
        print(f"{prog}: error: expected one argument, the job spec SPEC.json; got "
              f"{len(args)}: {' '.join(args)}".rstrip(": "), file=sys.stderr)
        return 2
    from ringflow.train import worker
    from ringflow.train.spec import JobSpec

    try:
        return worker.run(JobSpec.from_json_file(args[0]))
    except ConfigError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except RingflowError as exc:
        print(f"{prog}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
