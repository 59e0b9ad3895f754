"""TPTrainOperator across hosts over SSH (issue 11): per task try, every host is checked
(interpreter, numpy), gets the runtime (``shipping``), a free port range common to all hosts
and the job spec, then runs one ringflow launcher agent as an ``SSHJob``. An agent reads its
secrets line (the job token, ``secret_env``) from the channel's stdin, which stays open: if
the Airflow side goes, the channel ends and the agent stops its ranks. Ranks are host-major;
endpoints are ``host:base_port + local rank``.

With ``launcher="mpirun"`` one SSHJob runs on the first host instead: Open MPI's mpirun
(``ringflow.launch.mpirun``) starts the same agent command on every host, each agent taking
its host index from its MPI rank; the secrets line and the lifeline are that job's stdin,
and the agents' lines come back through mpirun, tagged with their host index.

The first agent that fails stops the others (each with its detached kill), and the failure
is the rank that failed first across the hosts, by the time its exit was seen. Lines come
back tagged ``[host/rank N]`` (``[host/launch]`` for an agent's own lines)."""

from __future__ import annotations

import json
import random
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringflow.errors import LaunchError
from ringflow.launch.result import parse_result_line
from ringflow.poprun.leftovers import stop_task_command
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.jobs.ssh import SSHJob
from ringflow_provider.launchers.shipping import Prepared, prepare_hosts
from ringflow_provider.remote_job import TASK_MARK_VAR, JobId, find_executable_command

__all__ = ["PORT_RANGE", "HostAgent", "MultiHostTraining", "failure_message", "tag_line"]

PORT_RANGE = (20000, 60000)
_PORT_TRIES = 8
_RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ")
_MPI_TAG = re.compile(r"^\[1,(\d+)\]<(stdout|stderr)>:(.*)$")
# Binds every port of the range on the host (all addresses), as the ranks will.
_PORT_PROBE = """import socket, sys
base, count = int(sys.argv[1]), int(sys.argv[2])
held = []
try:
    for port in range(base, base + count):
        s = socket.socket()
        s.bind(("", port))
        held.append(s)
except OSError as exc:
    print("busy %d %s" % (port, exc))
    sys.exit(1)
print("free")
"""


def tag_line(host: str, line: str) -> str:
    """A launcher's line as the task log shows it: ``[host/rank N] ...``, ``[host/launch]``."""
    found = _RANK_PREFIX.match(line)
    if found:
        return f"[{host}/rank {found[1]}] {line[found.end():]}"
    if line.startswith("[launch] "):
        return f"[{host}/launch] {line[len('[launch] '):]}"
    return f"[{host}] {line}"


@dataclass
class HostAgent:
    """One host's part of the job."""

    host: str
    index: int
    hook: MultiHostSSHHook
    prepared: Prepared | None = None
    job: SSHJob | None = None
    exit_code: int | None = None
    result: dict[str, Any] | None = None
    ended_at: float | None = None
    lines: list[str] = field(default_factory=list)   # the agent's own (`[launch]`) lines
    home: str = ""                                    # the SSH login's home there


class MultiHostTraining:
    """One task try of a training job on ``hosts``: ``prepare``, ``run``, ``stop``."""

    def __init__(self, hooks: Mapping[str, MultiHostSSHHook], hosts: Sequence[str],
                 job: JobId, python: str, nproc_per_host: int, log_dir: str,
                 on_line: Callable[[str, str, str], None], log: Any,
                 base_port: int | None = None, launcher: str = "ssh") -> None:
        self.hosts, self.job, self.python = list(hosts), job, python
        self.launcher = launcher
        self.nproc, self.log_dir, self.base_port = nproc_per_host, log_dir, base_port
        self.on_line, self.log = on_line, log
        self.agents = [HostAgent(h, i, hooks[h]) for i, h in enumerate(self.hosts)]
        self._stopped = False

    # before anything runs --------------------------------------------------------------------
    def prepare(self, spec: dict[str, Any]) -> None:
        """Preflight, runtime, ports and the spec on every host; LaunchError naming every
        host that failed a step."""
        hooks = {a.host: a.hook for a in self.agents}
        prepared = prepare_hosts(hooks, self.hosts, self.python)
        for agent in self.agents:
            agent.prepared = prepared[agent.host]
            self.log.info("%s", agent.prepared.describe())
        homes = self._on_every_host(
            lambda a: a.hook.run(a.host, 'printf %s "$HOME"', timeout=30)[1], "finding $HOME")
        for agent in self.agents:
            agent.home = homes[agent.host]
        if self.launcher == "mpirun":
            self._check_mpirun()
            self._stop_earlier_tries()
        if self.base_port is None:
            self.base_port = self._free_base_port()
        text = json.dumps(spec, indent=2) + "\n"
        self._on_every_host(lambda a: self._put_spec(a, text), "uploading the job spec")

    def _check_mpirun(self) -> None:
        """mpirun on the first host, and one runtime path for all (mpirun exports the first
        host's PYTHONPATH to every agent)."""
        first = self.agents[0]
        code, out, _ = first.hook.run(first.host, find_executable_command("mpirun"),
                                      timeout=30)
        if code != 0:
            raise LaunchError(f"launcher 'mpirun': Open MPI's mpirun not found on the first "
                              f"host {first.host!r} (Debian: apt install openmpi-bin)")
        path = first.prepared.shipped.pythonpath
        other = [f"{a.prepared.shipped.pythonpath} on {a.host!r}" for a in self.agents
                 if a.prepared.shipped.pythonpath != path]
        if other:
            raise LaunchError(f"launcher 'mpirun': the runtime is at {path} on {first.host!r} "
                              f"but at {', '.join(other)}: mpirun exports one PYTHONPATH to "
                              f"every agent, so the SSH login's home must be the same path "
                              f"on every host (or use launcher 'ssh')")
        self.log.info("launcher mpirun: %s on %s starts one agent per host", out.strip(),
                      first.host)

    def _stop_earlier_tries(self) -> None:
        """mpirun's agents on the other hosts are no SSHJob there: what an earlier try of
        the task left (agents and ranks carry the task's marker, which mpirun exports) is
        stopped on every host before this try starts."""
        def stop(agent: HostAgent) -> str:
            argv = stop_task_command(self.python, TASK_MARK_VAR, self.job.task_key)
            command = (f"PYTHONPATH={shlex.quote(agent.prepared.shipped.pythonpath)} "
                       f"{shlex.join(argv)}")
            code, out, err = agent.hook.run(agent.host, command, timeout=30)
            if code != 0:
                raise LaunchError(f"host {agent.host!r}: stopping an earlier try failed: "
                                  f"{(err or out).strip()}")
            return out.strip()

        for host, said in self._on_every_host(stop, "stopping earlier tries").items():
            if not said.startswith("nothing"):
                self.log.info("host %s: %s", host, said)

    def _free_base_port(self) -> int:
        rng = random.Random()
        for _ in range(_PORT_TRIES):
            base = rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - self.nproc)
            argv = [self.python, "-c", _PORT_PROBE, str(base), str(self.nproc)]
            found = self._on_every_host(
                lambda a, argv=argv: a.hook.run(a.host, shlex.join(argv), timeout=30),
                "looking for free ports")
            if all(code == 0 for code, _, _ in found.values()):
                self.log.info("ports %d-%d are free on every host", base,
                              base + self.nproc - 1)
                return base
        raise LaunchError(f"no range of {self.nproc} ports free on every host of "
                          f"{','.join(self.hosts)} after {_PORT_TRIES} tries; pass base_port")

    def _put_spec(self, agent: HostAgent, text: str) -> None:
        code, _, err = agent.hook.run(agent.host, f"mkdir -p {shlex.quote(self.log_dir)}",
                                      timeout=30)
        if code != 0:
            raise LaunchError(f"host {agent.host!r}: cannot make {self.log_dir}: {err.strip()}")
        sftp = agent.hook.open_sftp(agent.host)
        try:
            with sftp.open(f"{self.log_dir}/spec.json", "w") as f:
                f.write(text)
        except OSError as exc:
            raise LaunchError(f"host {agent.host!r}: cannot write {self.log_dir}/spec.json: "
                              f"{exc}") from exc
        finally:
            sftp.close()

    def _on_every_host(self, work: Callable[[HostAgent], Any], what: str) -> dict[str, Any]:
        results: dict[str, Any] = {}
        errors: list[str] = []

        def attempt(agent: HostAgent) -> None:
            try:
                results[agent.host] = work(agent)
            except LaunchError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=attempt, args=(a,), daemon=True)
                   for a in self.agents]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise LaunchError(f"{what} failed: " + "; ".join(sorted(errors)))
        return results

    # running ---------------------------------------------------------------------------------
    def agent_argv(self, agent: HostAgent) -> list[str]:
        return [self.python, "-m", "ringflow.launch", "--stdin", "--nproc-per-host",
                str(self.nproc), "--hosts", ",".join(self.hosts), "--host-index",
                str(agent.index), "--base-port", str(self.base_port), "--log-dir",
                self.log_dir, "-m", "ringflow.train", f"{self.log_dir}/spec.json"]

    def mpirun_argv(self, exports: Sequence[str]) -> list[str]:
        """The first host's command: mpirun (through ringflow.launch.mpirun) starts the
        agent command on every host, which takes its host index from its MPI rank; the
        `exports` variables of the first host's environment reach every agent."""
        agent = [self.python, "-m", "ringflow.launch", "--nproc-per-host", str(self.nproc),
                 "--hosts", ",".join(self.hosts), "--host-index-env", "OMPI_COMM_WORLD_RANK",
                 "--base-port", str(self.base_port), "--log-dir", self.log_dir, "-m",
                 "ringflow.train", f"{self.log_dir}/spec.json"]
        return [self.python, "-m", "ringflow.launch.mpirun", "--hosts", ",".join(self.hosts),
                "--stdin", "--export", ",".join(exports), "--", *agent]

    def run(self, env: Mapping[str, str], secrets_line: str) -> list[HostAgent]:
        """Every agent started, streamed until all have ended; the first failure stops the
        others. Returns the agents (exit codes, result lines)."""
        if self.launcher == "mpirun":
            return self._run_under_mpirun(env, secrets_line)
        threads = []
        for agent in self.agents:
            agent_env = {**env, "PYTHONPATH": agent.prepared.shipped.pythonpath}
            agent.job = SSHJob(agent.hook, agent.host, self.job, self.agent_argv(agent),
                               lambda stream, line, a=agent: self._line(a, stream, line),
                               env=agent_env, job_stdin=secrets_line, log=self.log)
        for agent in self.agents:
            if self._stopped:
                break
            agent.job.start()
            threads.append(threading.Thread(target=self._wait, args=(agent,), daemon=True,
                                            name=f"ringflow-agent-{agent.host}"))
            threads[-1].start()
        for t in threads:
            t.join()
        return self.agents

    def _run_under_mpirun(self, env: Mapping[str, str], secrets_line: str) -> list[HostAgent]:
        first = self.agents[0]
        argv = self.mpirun_argv(["PYTHONPATH", TASK_MARK_VAR, *env])
        first.job = SSHJob(first.hook, first.host, self.job, argv, self._mpirun_line,
                           env={**env, "PYTHONPATH": first.prepared.shipped.pythonpath},
                           job_stdin=secrets_line, log=self.log)
        if self._stopped:
            return self.agents
        first.job.start()
        try:
            code = first.job.wait()
        except LaunchError as exc:
            code = -1
            self.log.error("host %s: %s", first.host, exc)
        for agent in self.agents:
            agent.ended_at = time.time()
            agent.exit_code = (agent.result or {}).get("exit_code", code)
        if code != 0 and all(a.exit_code == 0 for a in self.agents):
            first.exit_code = code  # mpirun itself failed
        return self.agents

    def _mpirun_line(self, stream: str, line: str) -> None:
        """A line of mpirun's stream: an agent's (tagged with its MPI rank, its host index)
        or the first host's own."""
        tagged = _MPI_TAG.match(line)
        if tagged and int(tagged[1]) < len(self.agents):
            self._line(self.agents[int(tagged[1])], stream, tagged[3])
        else:
            self._line(self.agents[0], stream, line)

    def _line(self, agent: HostAgent, stream: str, line: str) -> None:
        result = parse_result_line(line)
        if result is not None:
            agent.result = result
        if line.startswith("[launch] "):
            agent.lines.append(line)
        self.on_line(agent.host, stream, line)

    def _wait(self, agent: HostAgent) -> None:
        try:
            agent.exit_code = agent.job.wait()
        except LaunchError as exc:
            agent.exit_code = -1
            self.log.error("host %s: %s", agent.host, exc)
        agent.ended_at = time.time()
        if agent.exit_code != 0 and not self._stopped:
            self.stop(f"host {agent.host} failed")

    def stop(self, why: str = "on_kill") -> None:
        """Stop every agent still running (each: one detached kill on its host), at once."""
        self._stopped = True
        senders = [threading.Thread(target=a.job.stop, args=(why,), daemon=True)
                   for a in self.agents if a.job is not None and a.exit_code is None]
        for t in senders:
            t.start()
        for t in senders:
            t.join(2.0)

    # after -----------------------------------------------------------------------------------
    def absolute(self, path: str | None) -> str | None:
        """A path the agents saw relative to their working folder (the login's home), as
        an absolute path of the first host."""
        if not path or path.startswith("/"):
            return path
        return f"{self.agents[0].home.rstrip('/')}/{path}"

    def first_failure(self) -> tuple[HostAgent, dict[str, Any]] | None:
        """(agent, failed rank's entry) of the rank that failed first across the hosts."""
        failed = []
        for agent in self.agents:
            result = agent.result or {}
            rank = result.get("failed_rank")
            if rank is None or result.get("status") != "failed":
                continue
            entry = next((r for r in result.get("ranks", []) if r.get("rank") == rank), {})
            # as each agent orders its own ranks (ringflow.launch.agent.failure_order): a
            # rank that failed on its own before one that saw a peer fail first, then by time
            failed.append(((bool(entry.get("after_peer_failure")),
                            entry.get("ended_at") or float("inf"), agent.index), agent, entry))
        if not failed:
            return None
        _, agent, entry = min(failed, key=lambda f: f[0])
        return agent, entry


def failure_message(training: MultiHostTraining) -> tuple[str, int]:
    """(what the task fails with, the exit code that decides about a retry): the rank that
    failed first across the hosts with its cause and its log's tail (its agent prints it),
    else the first agent that ended badly (an SSH stream lost, a launcher error)."""
    from ringflow_provider.tp_train.args import how
    from ringflow_provider.tp_train.report import failure_cause

    first = training.first_failure()
    if first is None:
        agent = next(a for a in training.agents if a.exit_code != 0)
        tail = agent.job.tail if agent.job is not None else []
        cause = (agent.result or {}).get("cause") or "no result line"
        return (f"training failed: the launcher agent on host {agent.host} ended with "
                f"{how(agent.exit_code)} ({cause}); last {len(tail)} lines of its output:\n"
                + "\n".join(tail), agent.exit_code)
    agent, entry = first
    rank, code = entry.get("rank"), entry.get("exit_code", agent.exit_code)
    tail = [line[len("[launch]   | "):] for line in agent.lines
            if line.startswith("[launch]   | ")]
    cause = failure_cause(tail) or (agent.result or {}).get("cause") or "no cause in its log"
    where = f"{agent.host}:{training.log_dir}/workerlog.{rank}"
    return (f"training failed: rank {rank} on host {agent.host} (pid {entry.get('pid', '?')}) "
            f"failed first with {how(code)}: {cause}; last {len(tail)} lines of {where}:\n"
            + "\n".join(tail), code)
