"""The fault table of the docs, made from what the fault tests measured (not written by hand).

`tests/provider/test_faults_across_hosts.py` appends one JSON record per scenario run to
`build/fault-results.jsonl` (scenario, launcher, mode, bound, measured seconds, the failure
line's head). This makes the newest record of each (scenario, launcher, mode) a row of a
Markdown table and replaces the table between the markers `<!-- fault-table -->` and
`<!-- end fault-table -->` in the docs' troubleshooting page (`docs/troubleshooting.md`), or
in FILE with `--write FILE`; `--print` prints the table instead.

    python scripts/fault_table.py [--results build/fault-results.jsonl] [--write FILE | --print]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "troubleshooting.md"
START, END = "<!-- fault-table -->", "<!-- end fault-table -->"
# the hosts' addresses change from run to run: the table shows them by role
_ADDRESS = re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")


_LAUNCHERS = {"ssh": 0, "mpirun": 1}
_MODES = {"attached": 0, "deferred": 1}


def newest(records: list[dict]) -> list[dict]:
    """The newest record of each scenario, launcher and mode: the scenarios in the order
    first seen (tests run in parallel record them interleaved), each one's rows by launcher
    (ssh, mpirun) and mode (attached, deferred)."""
    by_key: dict[tuple, dict] = {}
    scenarios: dict[str, int] = {}
    for record in records:
        scenarios.setdefault(record["scenario"], len(scenarios))
        by_key[(record["scenario"], record["launcher"], record["mode"])] = record
    return sorted(by_key.values(), key=lambda r: (
        scenarios[r["scenario"]], _LAUNCHERS.get(r["launcher"], len(_LAUNCHERS)), r["launcher"],
        _MODES.get(r["mode"], len(_MODES)), r["mode"]))


def table(records: list[dict]) -> str:
    rows = ["| scenario | launcher | mode | what the task says | bound | measured |",
            "|---|---|---|---|---|---|"]
    for r in newest(records):
        seen = _ADDRESS.sub("HOST", r["seen"]).replace("|", "\\|")
        measured = "-" if r.get("measured_s") is None else f"{r['measured_s']:g} s"
        rows.append(f"| {r['scenario']} | {r['launcher']} | {r['mode']} | {seen} | "
                    f"{r['bound']} | {measured} |")
    heartbeat = {r.get("heartbeat_s") for r in records if r.get("heartbeat_s")}
    note = (f"\nMeasured with `heartbeat_timeout` {', '.join(f'{h:g}' for h in sorted(heartbeat))}"
            f" s, on {records[-1]['at'][:10]}.\n" if heartbeat and records else "\n")
    return "\n".join(rows) + "\n" + note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "build" / "fault-results.jsonl")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--write", type=Path, default=DOC, metavar="FILE",
                        help=f"the page whose table is replaced (default {DOC.relative_to(ROOT)})")
    target.add_argument("--print", action="store_true", help="print the table, write nothing")
    ns = parser.parse_args(argv)
    try:
        lines = ns.results.read_text().splitlines()
    except OSError as exc:
        print(f"fault_table: no results to read ({exc}); run the fault tests first: "
              "pytest tests/provider/test_faults_across_hosts.py", file=sys.stderr)
        return 1
    text = table([json.loads(line) for line in lines if line.strip()])
    if ns.print:
        print(text, end="")
        return 0
    try:
        doc = ns.write.read_text()
    except OSError as exc:
        print(f"fault_table: cannot read {ns.write} ({exc.strerror})", file=sys.stderr)
        return 1
    if START not in doc or END not in doc:
        print(f"fault_table: {ns.write} has no {START} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = doc.split(START, 1)
    ns.write.write_text(f"{head}{START}\n{text}{END}{rest.split(END, 1)[1]}")
    print(f"fault_table: {len(newest([json.loads(x) for x in lines if x.strip()]))} row(s) "
          f"written to {ns.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
