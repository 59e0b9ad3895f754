"""Training-job fixtures: ``train_here`` runs ``ringflow.train``'s ``main`` in this process
(a world of one: no PADDLE_* variables, a fresh fleet, its rings of one removed after), and
the launcher harness of tests/runtime/launch (real launchers; nothing may outlive a test)
for multi-rank jobs, with helpers to read the metric lines back."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringflow.distributed import fleet
from ringflow.distributed.collective.registry import destroy_ring
from ringflow.train.metrics import parse_train_line
from tests.runtime.launch.conftest import launcher  # noqa: F401  (the fixture, reused)

REPO = Path(__file__).resolve().parents[3]
# small and quick: a 2-layer MLP and a 1-layer transformer
MLP_ARGS = {"input_size": 16, "hidden_size": 32, "num_classes": 8, "num_layers": 2}
TRANSFORMER_ARGS = {"vocab_size": 32, "seq_len": 8, "hidden_size": 16, "num_heads": 4,
            "num_layers": 1, "ffn_size": 32}
JOB_ENV = {"RINGFLOW_COMM_TIMEOUT": "60", "RINGFLOW_RENDEZVOUS_TIMEOUT": "60",
           "PYTHONPATH": str(REPO)}


@dataclass
class Output:
    """What a job printed: its exit code, stdout and stderr, and the parsed train lines."""

    code: int
    stdout: str
    stderr: str = ""
    metrics: list[dict] = field(init=False)
    summaries: list[dict] = field(init=False)

    def __post_init__(self) -> None:
        parsed = [p for p in map(parse_train_line, self.stdout.splitlines()) if p]
        self.metrics = [v for kind, v in parsed if kind == "metric"]
        self.summaries = [v for kind, v in parsed if kind == "summary"]

    @property
    def losses(self) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in self.metrics}

    @property
    def summary(self) -> dict:
        assert len(self.summaries) == 1, self.stdout + self.stderr
        return self.summaries[0]


def write_spec(directory: Path, spec: dict, name: str = "spec.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture
def train_here(tmp_path, capsys, monkeypatch):
    """``train_here(spec_dict) -> Output``: ``main([SPEC.json])`` in this process."""
    from ringflow.train.__main__ import main

    for name in list(os.environ):
        if name.startswith("PADDLE_"):
            monkeypatch.delenv(name)
    saved = dict(fleet._fleet.__dict__)
    count = iter(range(1000))

    def run(spec: dict) -> Output:
        path = write_spec(tmp_path, spec, f"spec{next(count)}.json")
        capsys.readouterr()
        code = main([str(path)])
        out, err = capsys.readouterr()
        return Output(code, out, err)

    try:
        yield run
    finally:
        for ring in (0, 1, 2):
            destroy_ring(ring)
        fleet._fleet.__dict__.clear()
        fleet._fleet.__dict__.update(saved)


def start_job(harness, spec: dict, nproc: int, name: str = "spec.json") -> subprocess.Popen:
    """``python -m ringflow.launch --nproc-per-host N -m ringflow.train SPEC.json``."""
    path = write_spec(harness.dir, spec, name)
    return harness.start("--nproc-per-host", str(nproc), "--log-dir", f"log-{path.stem}",
                         "-m", "ringflow.train", str(path), env=harness.env(**JOB_ENV))


def run_job(harness, spec: dict, nproc: int, name: str = "spec.json",
            timeout: float = 60.0) -> Output:
    done = harness.finish(start_job(harness, spec, nproc, name), timeout)
    return Output(done.returncode, done.stdout, done.stderr)


def read_until(proc: subprocess.Popen, stop, timeout: float) -> str:
    """Reads ``proc``'s stdout line by line until ``stop(line)`` is true; returns what it
    read. Fails past ``timeout`` or if the output ends first."""
    deadline, text, pending = time.monotonic() + timeout, [], b""
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout} s; read:\n{''.join(text)}")
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"output ended first; read:\n{''.join(text)}")
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace") + "\n"
            text.append(line)
            if stop(line):
                return "".join(text)
