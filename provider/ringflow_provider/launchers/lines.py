"""A job's output lines, read once for every backend: which host a line came from (an
agent's own stream, or Open MPI's `[1,<host index>]<stdout>:` tag when mpirun gathered the
agents), how the task log shows it (`[host/rank N] ...`, `[host/launch] ...`), and the
launcher's machine lines in it (`[train] metric|summary {json}` of rank 0, `[launch] result
{json}` of each agent).

A machine line is read only from a whole line (`ringflow.launch.lines.Line.whole`: it began
a line and ended with a newline) whose launcher prefix stands at its very start, unmarked:
`[rank 0] ` for rank 0's, the agent's `[launch] result `, under mpirun Open MPI's tag before
them. A piece the launcher marked as no whole line (`[rank 0]+ `, `[1,0]<stdout>+:`) is
shown, never read."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ringflow.launch import jobdir
from ringflow.launch.lines import PARTIAL_MARK, Line
from ringflow.launch.result import parse_result_line
from ringflow.train.metrics import parse_train_line

METRIC, SUMMARY, RESULT, TIMING = "metric", "summary", "result", "timing"
STDERR_MARK = jobdir.STDERR_MARK.decode()
_RANK_PREFIX = re.compile(rf"^\[rank (\d+)\]({re.escape(PARTIAL_MARK)}?) ")
_MPI_TAG = re.compile(rf"^\[1,(\d+)\]<(stdout|stderr)>({re.escape(PARTIAL_MARK)}?):(.*)\Z",
                      re.DOTALL)


@dataclass(frozen=True)
class JobLine:
    """One line of a job's output."""

    host: str | None      # None: a job of this host only (lines shown as they are)
    text: str             # as the agent printed it
    stream: str           # "stdout" | "stderr"
    kind: str | None = None                 # METRIC, SUMMARY, RESULT, TIMING or None
    payload: dict[str, Any] | None = None
    partial: bool = False  # mpirun's tag said it is no whole line

    @property
    def shown(self) -> str:
        """As the task log shows it."""
        return self.text if self.host is None else tag_line(self.host, self.text, self.partial)


def tag_line(host: str, line: str, partial: bool = False) -> str:
    """An agent's line as the task log shows it when several hosts are gathered:
    ``[host/rank N] ...``, ``[host/launch] ...`` (the agent's own), ``[host] ...``; a piece
    that is no whole line as ``[host/rank N]+ ...`` (`PARTIAL_MARK`)."""
    found = _RANK_PREFIX.match(line)
    mark = PARTIAL_MARK if partial else ""
    if found:
        return f"[{host}/rank {found[1]}]{found[2] or mark} {line[found.end():]}"
    if line.startswith("[launch] "):
        return f"[{host}/launch]{mark} {line[len('[launch] '):]}"
    return f"[{host}]{mark} {line}"


def machine_line(text: str) -> tuple[str, dict[str, Any]] | None:
    """(kind, payload) of a launcher machine line: rank 0's metric or summary (only rank 0
    prints them; another rank's line that looks like one is not taken), an agent's result."""
    if text.startswith("[rank 0] [train] "):
        return parse_train_line(text)
    result = parse_result_line(text) if text.startswith("[launch] result ") else None
    return (RESULT, result) if result is not None else None


def read_line(stream: str, raw: str, host: str | None,
              hosts: list[str] | None = None) -> JobLine:
    """A raw line of a part's stream (a `Line`, from the one line rule) as a JobLine. With
    `hosts` the stream is mpirun's: a tagged line belongs to the host its tag names, an
    untagged one to the first host. Only a whole line can be a machine line."""
    whole, partial = isinstance(raw, Line) and raw.whole, False
    if raw.startswith(STDERR_MARK):  # the supervisor's mark of a line from stderr
        stream, raw = "stderr", raw[len(STDERR_MARK):]
    if hosts is not None:
        tagged = _MPI_TAG.match(raw)
        if tagged and int(tagged[1]) < len(hosts):
            host, stream, raw = hosts[int(tagged[1])], tagged[2], tagged[4]
            partial = bool(tagged[3])
            whole = whole and not partial
        else:
            host = hosts[0]
    parsed = machine_line(raw) if stream == "stdout" and whole else None
    if parsed is None:
        return JobLine(host, raw, stream, partial=partial)
    return JobLine(host, raw, stream, parsed[0], parsed[1])


def lines_of(data: bytes, handle: Any, host: str) -> list[JobLine]:
    """The JobLines of a chunk of whole lines of the output of `handle`'s part on `host`."""
    from ringflow_provider.jobs.lines import LineSplitter

    found: list[JobLine] = []
    shown_host = host if handle.show_hosts else None
    gathered = list(handle.hosts) if handle.gathered else None
    splitter = LineSplitter("stdout", lambda stream, raw: found.append(
        read_line(stream, raw, shown_host, gathered)))
    splitter.feed(data)
    splitter.flush()
    return found


#: a metric line's numbers that its task log record carries as fields, for readers of the
#: log that want numbers, not prose (the Airflow UI's training views)
LOG_FIELDS = ("step", "loss", "lr", "samples_per_s")


def log_fields(line: JobLine) -> dict[str, Any]:
    """The structured fields of `line`'s task log record: a metric line's step, loss, learning
    rate and samples/s (those it has); nothing for any other line."""
    if line.kind != METRIC or not line.payload:
        return {}
    return {name: line.payload[name] for name in LOG_FIELDS
            if isinstance(line.payload.get(name), (int, float))
            and not isinstance(line.payload.get(name), bool)}
