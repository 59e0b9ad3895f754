#!/usr/bin/env python3
"""The owner of a LocalJob, for test_local_job.py: it starts the real launcher with --stdin
through LocalJob (the job token as the secrets line), prints the launcher's pid, and streams
its output until the test SIGKILLs this process, as Airflow's supervisor kills a task.

usage: local_job_owner.py WORKDIR NPROC SCRIPT   (RINGFLOW_JOB_TOKEN_FOR_STDIN in the env)
"""

import os
import sys

from ringflow.launch.stdin import encode_secrets
from ringflow_provider.jobs.local import LocalJob


def main() -> None:
    workdir, nproc, script = sys.argv[1:4]
    token = os.environ.pop("RINGFLOW_JOB_TOKEN_FOR_STDIN")
    argv = [sys.executable, "-m", "ringflow.launch", "--stdin", "--nproc-per-host", nproc,
            "--log-dir", "log", script]
    job = LocalJob(argv, lambda stream, line: print(f"{stream}: {line}", flush=True),
                   env=dict(os.environ), cwd=workdir,
                   stdin_line=encode_secrets({"RINGFLOW_JOB_TOKEN": token}))
    print(f"launcher {job.start()}", flush=True)
    job.wait()


if __name__ == "__main__":
    main()
