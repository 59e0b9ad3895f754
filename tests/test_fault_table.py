"""scripts/fault_table.py: the docs' fault table is made from the fault tests' records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fault_table.py"


def records(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(scenario: str, launcher: str, measured: float | None, seen: str) -> dict:
    return {"scenario": scenario, "launcher": launcher, "mode": "attached", "bound": "b",
            "measured_s": measured, "seen": seen, "heartbeat_s": 6.0,
            "at": "2026-12-03T08:00:00Z"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=30)


def test_the_newest_record_of_each_scenario_makes_a_row_with_hosts_by_role(tmp_path):
    path = records(tmp_path / "r.jsonl",
                   row("partition", "ssh", 9.6, "lost contact with host 10.1.2.3 (ranks 2, 3)"),
                   row("partition", "mpirun", 14.1, "lost contact with host 10.9.9.3"),
                   row("partition", "ssh", 10.2, "lost contact with host 10.4.5.6 (ranks 2, 3)"))
    out = run("--results", str(path), "--print")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2:4] == [
        "| partition | ssh | attached | lost contact with host HOST (ranks 2, 3) | b | 10.2 s |",
        "| partition | mpirun | attached | lost contact with host HOST | b | 14.1 s |"]
    assert "Measured with `heartbeat_timeout` 6 s, on 2026-12-03." in out.stdout


def test_write_replaces_only_the_table_between_the_markers(tmp_path):
    path = records(tmp_path / "r.jsonl", row("flap", "ssh", None, "the task succeeds"))
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- fault-table -->\nold\n<!-- end fault-table -->\nafter\n")
    assert run("--results", str(path), "--write", str(doc)).returncode == 0
    text = doc.read_text()
    assert text.startswith("before\n<!-- fault-table -->\n| scenario |")
    assert "| flap | ssh | attached | the task succeeds | b | - |" in text
    assert "old" not in text and text.endswith("<!-- end fault-table -->\nafter\n")


def test_by_default_it_writes_the_troubleshooting_page_of_the_docs(tmp_path):
    """The script run from a copy of the repository's layout (tmp): without --write it
    replaces the table in docs/troubleshooting.md next to its scripts/ folder."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "docs").mkdir()
    script = tmp_path / "scripts" / "fault_table.py"
    script.write_text(SCRIPT.read_text())
    page = tmp_path / "docs" / "troubleshooting.md"
    page.write_text("# Troubleshooting\n<!-- fault-table -->\n<!-- end fault-table -->\n")
    path = records(tmp_path / "r.jsonl", row("flap", "ssh", None, "the task succeeds"))
    out = subprocess.run([sys.executable, str(script), "--results", str(path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"fault_table: 1 row(s) written to {page}\n"
    assert "| flap | ssh | attached | the task succeeds | b | - |" in page.read_text()
    page.unlink()
    out = subprocess.run([sys.executable, str(script), "--results", str(path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and f"cannot read {page}" in out.stderr


def test_without_results_it_says_how_to_make_them(tmp_path):
    out = run("--results", str(tmp_path / "none.jsonl"), "--print")
    assert out.returncode == 1 and "run the fault tests first" in out.stderr


def test_rows_recorded_interleaved_are_grouped_by_scenario_launcher_and_mode(tmp_path):
    """Two test workers record their scenarios interleaved; the table groups them."""
    rows = [{**row(scenario, launcher, None, "s"), "mode": mode} for scenario, launcher, mode in (
        ("flap", "mpirun", "deferred"), ("partition", "ssh", "attached"),
        ("flap", "ssh", "deferred"), ("partition", "mpirun", "attached"),
        ("flap", "ssh", "attached"))]
    out = run("--results", str(records(tmp_path / "r.jsonl", *rows)), "--print")
    assert out.returncode == 0, out.stderr
    got = [tuple(cell.strip() for cell in line.split("|")[1:4])
           for line in out.stdout.splitlines()[2:7]]
    assert got == [("flap", "ssh", "attached"), ("flap", "ssh", "deferred"),
                   ("flap", "mpirun", "deferred"), ("partition", "ssh", "attached"),
                   ("partition", "mpirun", "attached")]
