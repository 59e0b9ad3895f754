"""The lifecycle primitives under the launchers (`ringflow_provider.launchers`): a command
in its own session and process group on this host, streamed as whole lines and stopped as a
group (`LocalJob`), the one line splitter of every stream, and the one rule for which values
are secret and how they are hidden (`Secrets`). Lines reach ``on_line(stream, line)`` in the
thread that calls ``wait()``, as the job printed them: mask before logging.

A local training job, as an operator runs it (`execute`, then `on_kill` from Airflow's
SIGTERM handler while `wait` runs; the launcher's `--stdin` gets the secrets line, and its
ranks stop when the stdin pipe ends; `encode_secrets` is `ringflow.launch.stdin`'s)::

    secrets = Secrets().add(token).add_env(secret_env, all_secret=True)
    secrets.register()                                 # Airflow's masker: task log, XCom
    argv = [sys.executable, "-m", "ringflow.launch", "--stdin", "--nproc-per-host", "2",
            "--log-dir", log_dir, "-m", "ringflow.train", spec_path]
    line = encode_secrets({"RINGFLOW_JOB_TOKEN": token, **secret_env})
    with LocalJob(argv, lambda stream, text: self.log.info("%s", secrets.mask(text)),
                  env={**os.environ, "RINGFLOW_JOB_ID": job_id}, stdin_line=line,
                  grace_s=8.0) as job:                 # `with`: nothing outlives the block
        self._job = job                                # on_kill: self._job.stop()
        job.start()
        exit_code = job.wait()                         # 128+N if signal N ended it
"""

from __future__ import annotations

from typing import Any, Protocol

from ringflow_provider.jobs.lines import MAX_LINE_BYTES, LineSink, LineSplitter
from ringflow_provider.jobs.local import LocalJob
from ringflow_provider.jobs.masking import MASK, Secrets, is_secret_name, mask_text

__all__ = ["MASK", "MAX_LINE_BYTES", "Job", "LineSink", "LineSplitter", "LocalJob", "Secrets",
           "is_secret_name", "mask_text"]


class Job(Protocol):
    """What an operator needs from a job, wherever it runs."""

    @property
    def pgid(self) -> int | None:
        """The job's process group, once known."""

    @property
    def exit_code(self) -> int | None:
        """Shell style, once it ended: 128+N when signal N ended it."""

    @property
    def tail(self) -> list[str]:
        """The last lines of output (for a failure message; mask them)."""

    def start(self) -> Any:
        """Start it; LaunchError if it cannot be started."""

    def wait(self) -> int | None:
        """Stream lines to `on_line` until it ends; its exit code."""

    def stop(self) -> str:
        """Stop its whole process group; returns within about 2 s, saying what it did."""

    def close(self) -> None:
        """Release what the job holds here."""
