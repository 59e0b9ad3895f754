#!/usr/bin/env python3
"""Stand-in for Graphcore's `poprun`, which cannot run here (no IPUs, no Poplar SDK, no V-IPU).

The tests put it on the PATH of the SSH server they start, as `poprun`. It prints the argv it
received and the environment each instance would get from mpirun's `-x NAME=VALUE` options
(a bare `-x NAME` takes NAME's value from poprun's own environment, as Open MPI's does; a
value that came that way is printed as its SHA-256 digest, never as itself), then runs the
program once per instance with that environment (stdout/stderr inherited, so output streams
as the program writes it) and exits with the first non-zero exit code.
"""

import hashlib
import json
import os
import subprocess
import sys


def split_options(argv):
    """poprun [options] program [args]: options until the first token not starting with '-'."""
    for i, token in enumerate(argv):
        if not token.startswith("-"):
            return argv[:i], argv[i:]
    return argv, []


def exports(text, shown):
    """The -x variables of one option value; `shown` gets what may be printed of each."""
    tokens = text.split()
    env = {}
    for flag, item in zip(tokens[::2], tokens[1::2]):
        if flag == "-x":
            name, has_value, value = item.partition("=")
            if has_value:
                env[name] = shown[name] = value
            elif name in os.environ:  # Open MPI: a bare -x exports the caller's value
                env[name] = os.environ[name]
                shown[name] = "sha256:" + hashlib.sha256(env[name].encode()).hexdigest()
    return env


def main():
    options, program = split_options(sys.argv[1:])
    print("standin-poprun argv=" + json.dumps(sys.argv[1:]), flush=True)
    values = dict(opt[2:].split("=", 1) for opt in options if opt.startswith("--") and "=" in opt)
    common_shown = {}
    common = exports(values.get("mpi-local-args", ""), common_shown)
    per_instance = {}
    for opt in options:
        if opt.startswith("--instance-mpi-local-args="):
            index, _, text = opt.split("=", 1)[1].partition(":")
            shown = {}
            per_instance[int(index)] = (exports(text, shown), shown)
    procs = []
    for index in range(int(values.get("num-instances", "1"))):
        own, own_shown = per_instance.get(index, ({}, {}))
        env = {**common, **own}
        print(f"standin-poprun instance={index} env=" + json.dumps({**common_shown, **own_shown}),
              flush=True)
        procs.append(subprocess.Popen(program, env={**os.environ, **env}, stdin=subprocess.DEVNULL))
    codes = [proc.wait() for proc in procs]
    sys.exit(next((c for c in codes if c != 0), 0))


if __name__ == "__main__":
    main()
