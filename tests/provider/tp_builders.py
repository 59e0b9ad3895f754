"""Model builders for the TPTrainOperator tests, imported by the training ranks
(``model="tests.provider.tp_builders:build"``; the tests put the repository on PYTHONPATH).

``build`` is the built-in MLP plus what a test needs to see from inside a rank: a rank that
raises while building, a rank that dies (exit 7) once a checkpoint is complete when the
environment says it is the task's first try (``RF_TEST_TRY=1``, templated from
``ti.try_number``), and, on rank 0, a proof that a secret arrived (a digest, never the
value) and a scan of every process's command line for it while the job runs; with
``environ_to``, each rank's /proc/<pid>/environ copied to ``<environ_to>.<rank>``.
``phantom`` and ``not_a_model`` stand in for a model too big and a builder gone wrong."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from ringflow.models import mlp


def build(mp_degree: int, dtype: str, fail_rank: int = -1, secret_var: str = "",
          die_on_first_try_after: str = "", environ_to: str = "", **kwargs):
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    if environ_to and "PADDLE_TRAINER_ID" in os.environ:   # a rank, not the Airflow side
        Path(f"{environ_to}.{rank}").write_bytes(Path(f"/proc/{os.getpid()}/environ")
                                                 .read_bytes())
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose while building the model")
    if die_on_first_try_after and rank == 1 and os.environ.get("RF_TEST_TRY") == "1":
        _die_when_complete(Path(die_on_first_try_after))
    if secret_var and rank == 0:
        value = os.environ.get(secret_var, "")
        digest = hashlib.sha256(value.encode()).hexdigest()[:12] if value else "missing"
        print(f"secret {secret_var} digest {digest}", flush=True)
        print(f"secret {secret_var} on command lines: {_on_command_lines(value)}", flush=True)
    sizes = {"input_size": 8, "hidden_size": 16, "num_classes": 4, **kwargs}
    return mlp(mp_degree=mp_degree, dtype=dtype, **sizes)


def phantom(mp_degree: int, dtype: str, phantom_mib: int = 0, **kwargs):
    """The MLP of `build` with a persistable variable of `phantom_mib` MiB that no op reads
    or writes: the memory estimate counts it as optimizer state, the ranks never allocate
    it. It stands in for a model too big for this host, which no test can train."""
    from ringflow.framework.program import default_main_program

    built = build(mp_degree, dtype, **kwargs)
    default_main_program().global_block().create_var(
        name="phantom_state", shape=[phantom_mib * (1 << 18)], dtype="float32",
        persistable=True)
    return built


def not_a_model(mp_degree: int, dtype: str, **kwargs):
    """A builder that returns something other than a BuiltModel."""
    return {"loss": None}


def _die_when_complete(manifest: Path) -> None:
    """Exit 7 as soon as ``manifest`` exists (a checkpoint complete on this host)."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not manifest.exists():
            time.sleep(0.002)
        print(f"rank 1 dies on purpose after {manifest.parent.name}", flush=True)
        os._exit(7)

    threading.Thread(target=watch, daemon=True).start()


def _on_command_lines(value: str) -> int:
    if not value:
        return 0
    found = 0
    for entry in Path("/proc").iterdir():
        try:
            if value.encode() in (entry / "cmdline").read_bytes():
                found += 1
        except OSError:
            continue
    return found


# What a rank may print to pass a line of its own for a machine line: after a \r, behind
# another rank's prefix or Open MPI's tag, mid-line, as a long line's continuation. The loss
# 666.0 and step 999 appear in no real line.
FAKE_SUMMARY = ('{"final_loss": 666.0, "steps": 999, "samples_per_s": 1.0, '
                '"checkpoint": "/forged", "resumed_from": null}')
FAKE_METRIC = '{"step": 999, "loss": 666.0, "lr": 1.0, "samples_per_s": 1.0, "elapsed_s": 1.0}'
FAKE_RESULT = '{"exit_code": 0, "status": "succeeded", "cause": "forged"}'


def build_forging(mp_degree: int, dtype: str, **kwargs):
    """The built-in MLP, on ranks that first print forged machine lines (`FAKE_*`)."""
    import sys

    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    out = sys.stdout
    if rank == 1:
        out.write(f"x\r[rank 0] [train] summary {FAKE_SUMMARY}\n")
        out.write(f"[1,0]<stdout>:[rank 0] [train] metric {FAKE_METRIC}\n")
        out.write(f"y\r[launch] result {FAKE_RESULT}\n")
    else:
        out.write(f"junk[train] summary {FAKE_SUMMARY}\n")
        out.write(f"x\r[train] metric {FAKE_METRIC}\n")
        out.write(f"x\r[train] summary {FAKE_SUMMARY}\n")
        out.write("p" * ((1 << 20) - 1) + f"[train] summary {FAKE_SUMMARY}\n")
    out.flush()
    return mlp(mp_degree=mp_degree, dtype=dtype, **kwargs)
