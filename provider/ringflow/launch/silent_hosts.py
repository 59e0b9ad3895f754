"""Stopping, over SSH, what is left of an mpirun job on hosts mpirun cannot reach.

mpirun gives a host up when its processes sent no exit report after another failed (its
daemon is gone, or frozen with the job's processes by SIGSTOP), and it ends on a stop from
here without stopping what runs on a frozen host. Either way the job's processes there would
stay (stopped for ever, in the frozen case). `HostStops` runs, on each such host, the stop of
`ringflow.launch.leftovers.stop_frozen_job_command` (continue, TERM, KILL what carries the
job's token, which goes on ssh's stdin) and says in one line per host what it found. A host
that does not answer is cut off: it is left to its own ranks, which stop by themselves when
their peers go silent.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

from ringflow.launch.leftovers import stop_frozen_job_command
from ringflow.launch.secret_drop import is_this_host, rsh_command

# A host whose SSH answers has its job's processes continued and stopped (STOP_GRACE_S from
# SIGTERM to SIGKILL, STOP_S in all at most from the give-up); a host whose SSH has not
# answered CONNECT_S after the give-up, when mpirun has ended, is not waited for (cut off).
STOP_GRACE_S = 1.0
STOP_S = 6.0
CONNECT_S = 1.0
CONNECT_TIMEOUT_S = 2.0  # ssh's own ConnectTimeout
_CONNECTED = "ringflow-connected"


class HostStops:
    """The stops of one job: `start` them (each host in its own thread), `join` within the
    bounds above once mpirun has ended."""

    def __init__(self, environ: Mapping[str, str], token: Callable[[], str],
                 say: Callable[[str], None]) -> None:
        self.environ = environ
        self.token = token
        self.say = say
        # (thread, its SSH answered, its ssh process)
        self._stops: list[tuple[threading.Thread, threading.Event,
                                list[subprocess.Popen[str]]]] = []
        self._started_at = 0.0

    def start(self, hosts: list[str], label: str) -> None:
        """A stop on each of `hosts` but this one; its line names the host with `label`."""
        self._started_at = time.monotonic()
        for host in dict.fromkeys(hosts):
            if not is_this_host(host):
                connected, procs = threading.Event(), []
                stop = threading.Thread(target=self._stop, args=(host, connected, procs, label),
                                        daemon=True, name=f"ringflow-stop-{host}")
                stop.start()
                self._stops.append((stop, connected, procs))

    def _stop(self, host: str, connected: threading.Event,
              procs: list[subprocess.Popen[str]], label: str) -> None:
        command = shlex.join(stop_frozen_job_command(sys.executable, STOP_GRACE_S))
        pythonpath = os.environ.get("PYTHONPATH")
        if pythonpath:
            command = f"PYTHONPATH={shlex.quote(pythonpath)} {command}"
        argv = [*rsh_command(self.environ), "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S:g}", host,
                f"echo {_CONNECTED} && {command}"]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            self.say(f"{host}: could not stop what is left of the job there: {exc}")
            return
        procs.append(proc)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        with contextlib.suppress(OSError):
            proc.stdin.write(self.token() + "\n")
            proc.stdin.close()
        said = []
        for line in proc.stdout:
            if line.strip() == _CONNECTED:
                connected.set()
            elif line.strip():
                said.append(line.strip())
        err = proc.stderr.read().strip()
        code = proc.wait()
        if not connected.is_set():
            self.say(f"{host} did not answer to stop what is left of the job there"
                     + (f": {err.splitlines()[-1]}" if err and code >= 0 else ""))
        else:
            self.say(f"{host} {label}: {(said or err.splitlines() or ['no output'])[-1]}")

    def join(self) -> None:
        """Wait for the stops: those whose SSH answered until they are done (STOP_S after
        the start at most); the others until CONNECT_S after it, then their ssh is killed."""
        for stop, connected, procs in self._stops:
            connect_by = self._started_at + CONNECT_S
            while not connected.is_set() and stop.is_alive() and time.monotonic() < connect_by:
                connected.wait(0.05)
            if not connected.is_set():
                _kill(procs)
            stop.join(max(0.0, self._started_at + STOP_S - time.monotonic()))
            if stop.is_alive():
                _kill(procs)
                stop.join(1.0)


def _kill(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
