"""How a job of ringflow launcher agents ended, from its lines and its parts' final status:
each agent's result line (`[launch] result {json}`), the last lines of each host, the rank
that failed first across the hosts (the rule each agent applies to its own ranks:
`ringflow.launch.exits.failure_order`) and the message a failed task gives."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ringflow.launch.exits import describe_exit, end_of_blame, failure_order
from ringflow.launch.leftovers import daemon_lost_host, frozen_given_up_host
from ringflow_provider.launchers.lines import RESULT, JobLine

TAIL_LINES = 20
_TAIL_PREFIX = "[launch]   | "  # an agent's copy of its failed rank's last log lines


def how(exit_code: int | None) -> str:
    """``exit code 137 (128+9: SIGKILL)`` (the runtime's one wording), or that none came."""
    return "no exit code" if exit_code is None else describe_exit(exit_code)


@dataclass
class AgentOutcome:
    """What the agents said, per host (None: a job of this host only)."""

    results: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    tails: dict[str | None, deque[str]] = field(default_factory=dict)
    rank_tails: dict[str | None, list[str]] = field(default_factory=dict)
    # hosts an mpirun job gave up as silent whose job the stop there found frozen
    frozen_hosts: set[str] = field(default_factory=set)
    # hosts whose Open MPI daemon mpirun lost (rebooted, down, the daemon killed), in order
    daemons_lost: list[str] = field(default_factory=list)

    def feed(self, line: JobLine) -> None:
        self.tails.setdefault(line.host, deque(maxlen=TAIL_LINES)).append(line.text)
        frozen = frozen_given_up_host(line.text)
        if frozen is not None:
            self.frozen_hosts.add(frozen)
        lost = daemon_lost_host(line.text)
        if lost is not None and lost not in self.daemons_lost:
            self.daemons_lost.append(lost)
        if line.text.startswith(_TAIL_PREFIX):
            self.rank_tails.setdefault(line.host, []).append(line.text[len(_TAIL_PREFIX):])
        if line.kind == RESULT and line.payload is not None:
            self.results[line.host] = line.payload
            self.rank_tails.setdefault(line.host, [])

    def first_failure(self, hosts: list[str | None],
                      clock_offsets: dict[str, float] | None = None,
                      halted: set[str] | frozenset[str] = frozenset()
                      ) -> tuple[str | None, dict] | None:
        """(host, the failed rank's entry) of the rank that failed first across the hosts:
        one that failed on its own before one that saw a peer fail first, then by the time
        it began to exit, then by host order. A time a host reported is put on the
        launcher's clock with that host's `clock_offsets` (`clocks.clock_offsets`): a
        host whose clock is seconds behind does not come first by its own account. A failure
        that blamed a rank whose own failure another host reported leads to that one
        (`end_of_blame`). The failures of `halted` hosts (found frozen: their ranks ran
        again only when the launcher continued them to stop them) come after every other
        host's, whatever their times."""
        failed = []
        for index, host in enumerate(hosts):
            result = self.results.get(host) or {}
            rank = result.get("failed_rank")
            if rank is None or result.get("status") != "failed":
                continue
            entry = next((r for r in result.get("ranks", []) if r.get("rank") == rank), {})
            began = entry.get("ended_at")
            if isinstance(began, (int, float)) and host is not None:
                began += (clock_offsets or {}).get(host, 0.0)
            failed.append(((host in halted, *failure_order(
                bool(entry.get("after_peer_failure")), began, index)), host, entry))
        if not failed:
            return None
        first = min(failed, key=lambda f: f[0])
        # a host's failure that followed a rank's failure on another host comes after it
        by_rank = {f[2].get("rank"): f for f in failed if isinstance(f[2].get("rank"), int)}
        _, host, entry = end_of_blame(first, by_rank, lambda f: (
            f[2].get("blamed_rank") if f[2].get("after_peer_failure") else None))
        return host, entry


def rank_failure(outcome: AgentOutcome, host: str | None, entry: dict, log_dir: str | None,
                 cause_of: Any, local_name: str = "this host") -> tuple[str, int]:
    """The message and exit code of a failed rank: where, how, why, its last log lines
    (`host` None: a job of this host, called `local_name`)."""
    rank = entry.get("rank")
    code = entry.get("exit_code")
    result = outcome.results.get(host) or {}
    code = code if isinstance(code, int) else result.get("exit_code", 1)
    tail = outcome.rank_tails.get(host) or []
    cause = cause_of(tail) or result.get("cause") or "no cause in its log"
    where = f"host {local_name if host is None else host}"
    log = f"{log_dir}/workerlog.{rank}" if log_dir else f"workerlog.{rank}"
    source = log if host is None else f"{host}:{log}"
    return (f"training failed: rank {rank} on {where} (pid {entry.get('pid', '?')}) failed "
            f"first with {how(code)}: {cause}; last {len(tail)} lines of {source}:\n"
            + "\n".join(tail), code)


def part_failure(outcome: AgentOutcome, host: str | None, final: dict[str, Any],
                 local_name: str = "this host") -> tuple[str, int]:
    """The message and exit code when no rank failed but a part ended badly (the agent
    itself failed, its supervisor vanished, its host could not be reached)."""
    tail = list(outcome.tails.get(host) or [])
    code = final.get("exit_code")
    where = f"host {local_name if host is None else host}"
    state = final.get("state")
    if state in ("lost", "unreachable"):
        why = ("its supervisor vanished before the job ended (the host rebooted, or it was "
               "killed)" if state == "lost"
               else final.get("cause") or "the host could not be reached")
        said = f"training failed: lost contact with {where}: {why.removeprefix(f'host {host!r}: ')}"
    else:
        result = outcome.results.get(host) or {}
        what = f"{how(code)} ({result.get('cause') or final.get('cause') or 'no result line'})"
        said = f"training failed: the launcher agent on {where} ended with {what}"
    return (f"{said}; last {len(tail)} lines of its output:\n" + "\n".join(tail),
            code if isinstance(code, int) else 1)


DAEMON_LOST_WHY = ("mpirun lost its Open MPI daemon there (the host rebooted or went down, or "
                   "the daemon was killed)")


def daemon_lost_failure(outcome: AgentOutcome, hosts: list[str], nproc: int,
                        last_step: int | None) -> tuple[str, str] | None:
    """The message and the host to blame when no rank failed first but mpirun lost a host's
    daemon (it ends the job at once, often before any rank noticed): the first such host of
    the job. None when mpirun lost none."""
    lost = next((h for h in outcome.daemons_lost if h in hosts), None)
    if lost is None:
        return None
    index = hosts.index(lost)
    ranks = ", ".join(str(r) for r in range(index * nproc, (index + 1) * nproc))
    step = f" after step {last_step}" if last_step is not None else " before the first step"
    tail = list(outcome.tails.get(hosts[0]) or [])
    return (f"training failed: lost contact with host {lost} (ranks {ranks}){step}: "
            f"{DAEMON_LOST_WHY}; last {len(tail)} lines of the launch host's output:\n"
            + "\n".join(tail), lost)


def lost_host_failure(outcome: AgentOutcome, hosts: list[str], host: str, entry: dict,
                      finals: dict[str, dict[str, Any]], nproc: int, cause: str | None,
                      last_step: int | None, gathered: bool = False) -> tuple[str, str] | None:
    """The message and the host to blame when the rank that failed first only noticed a peer go
    silent (it reported `after_peer_failure` and the peer's global rank) and that peer's
    host is the root cause: its part could not be reached (the host was lost: down,
    partitioned) or its ranks were alive but silent until the launcher stopped them (the
    host froze). For a job whose parts are gathered by Open MPI's mpirun on the first host,
    a blamed host whose agent never reported is lost (mpirun gave up on it), or froze when
    the stop over SSH found its job's processes stopped (`frozen_hosts`). None when the rule
    does not apply (the rank's own failure is the cause)."""
    blamed = entry.get("blamed_rank")
    if not entry.get("after_peer_failure") or not isinstance(blamed, int) or nproc < 1:
        return None
    index = blamed // nproc
    if not 0 <= index < len(hosts) or hosts[index] == host:
        return None
    lost = hosts[index]
    final = finals.get(lost) or {}
    result = outcome.results.get(lost) or {}
    ranks = ", ".join(str(r) for r in range(index * nproc, (index + 1) * nproc))
    if final.get("frozen") or lost in outcome.frozen_hosts:
        subject = f"host {lost} froze"
        why = ("its job's processes were frozen (stopped by SIGSTOP) while its SSH connection "
               "answered; the launcher continued them to stop them")
    elif final.get("state") in ("unreachable", "lost"):
        subject = f"lost contact with host {lost}"
        why = ("its agent's SSH connection is down" if final.get("state") == "unreachable"
               else "its supervisor vanished (the host rebooted, or it was killed)")
    elif result.get("status") == "stopped" and result.get("ranks") and all(
            r.get("stopped_by_launcher") for r in result["ranks"]):
        subject = f"host {lost} stopped answering"
        why = ("its ranks were alive but silent (frozen or overloaded) until the launcher "
               "stopped them; its SSH connection answered")
    elif gathered and lost in outcome.daemons_lost:
        subject = f"lost contact with host {lost}"
        why = DAEMON_LOST_WHY
    elif gathered and not result:
        subject = f"lost contact with host {lost}"
        why = ("its launcher agent never reported: Open MPI's daemon there went silent (the "
               "host unreachable or hung)")
    else:
        return None
    step = f" after step {last_step}" if last_step is not None else " before the first step"
    noticed = f"rank {entry.get('rank')} on host {host} noticed first"
    return (f"training failed: {subject} (ranks {ranks}){step}: {why}; {noticed}: "
            f"{cause or 'no cause in its log'}", lost)
