"""The memory estimate of a rank (ringflow.train.memory): its parts from the rank's built
program (the shard under tensor parallelism, the optimizer's state), held against the real
peak resident memory of a training run, and the check against a host's MemAvailable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ringflow.distributed import fleet
from ringflow.errors import ConfigError
from ringflow.train import memory
from ringflow.train.spec import JobSpec

MLP = {"input_size": 64, "hidden_size": 256, "num_classes": 10}
#: how far the estimate may be from the real peak resident memory, either way: numpy's
#: temporaries (a kernel's intermediate arrays) come and go, and the executor reuses some
#: buffers (measured: 1.07 for the MLP, 1.27 for the transformer)
FACTOR = 1.5


def mlp_spec(**fields) -> JobSpec:
    return JobSpec.from_dict({"model": "mlp", "model_args": MLP, "checkpoint_dir": None,
                              **fields})


def test_a_tensor_parallel_rank_holds_its_shard_of_each_split_layer():
    """fc1 (column parallel) splits its weight and bias, fc2 (row parallel) its weight; fc2's
    bias is whole on every rank. Adam keeps two moments per element and two beta powers per
    parameter, and one learning rate."""
    i, h, c = MLP["input_size"], MLP["hidden_size"], MLP["num_classes"]
    for mp in (1, 2):
        got = memory.estimate(mlp_spec(tensor_parallel_degree=mp), world_size=mp)
        elements = i * h // mp + h // mp + h // mp * c + c
        assert got.parameters == got.gradients == 4 * elements
        assert got.optimizer_state == 4 * (2 * elements + 2 * 4 + 1)


def test_plain_sgd_keeps_only_its_learning_rate_and_activations_scale_with_the_batch():
    small = memory.estimate(mlp_spec(optimizer={"type": "sgd", "learning_rate": 0.1},
                                     global_batch_size=32), world_size=1)
    large = memory.estimate(mlp_spec(optimizer={"type": "sgd", "learning_rate": 0.1},
                                     global_batch_size=64), world_size=1)
    assert small.optimizer_state == 4
    assert 1.9 < large.activations / small.activations <= 2.0
    # data parallel 2: each rank runs half the global batch
    assert memory.estimate(mlp_spec(optimizer={"type": "sgd", "learning_rate": 0.1},
                                    global_batch_size=64), world_size=2).activations == \
        small.activations


def test_estimating_leaves_this_process_fleet_state_as_it_was():
    before = fleet.is_initialized()
    memory.estimate(mlp_spec(tensor_parallel_degree=2), world_size=2)
    assert fleet.is_initialized() == before


#: `python -m ringflow.train SPEC` in this process, then its VmHWM (kB) written to a file
_RUN_AND_TELL_PEAK = """
import re, runpy, sys
spec, out = sys.argv[1:]
sys.argv = ["ringflow.train", spec]
try:
    runpy.run_module("ringflow.train", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    if exc.code:
        raise
with open("/proc/self/status") as f:
    peak = re.search(r"^VmHWM:\\s+(\\d+) kB", f.read(), re.M)[1]
with open(out, "w") as f:
    f.write(peak)
"""


@pytest.mark.parametrize("spec", [
    {"model": "mlp", "global_batch_size": 256, "optimizer": {"type": "adam"},
     "model_args": {"input_size": 512, "hidden_size": 1024, "num_classes": 64,
                    "num_layers": 3}},
    {"model": "transformer", "global_batch_size": 16,
     "model_args": {"vocab_size": 1024, "seq_len": 64, "hidden_size": 128, "num_heads": 4,
                    "num_layers": 2}},
], ids=["mlp", "transformer"])
def test_the_estimate_is_within_a_factor_of_the_real_peak_resident_memory(spec, tmp_path):
    spec = JobSpec.from_dict({**spec, "steps": 2, "checkpoint_dir": None,
                              "optimizer": {"type": "adam", "learning_rate": 1e-3}})
    got = memory.estimate(spec, world_size=1)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_dict()))
    # the peak as the run's own memory holds it (VmHWM after the run): the child's rusage
    # ru_maxrss would also count the pytest process it was forked from (Linux keeps the
    # forked copy's high-water mark across exec), hundreds of MiB late in a suite
    hwm = tmp_path / "vmhwm"
    proc = subprocess.run([sys.executable, "-c", _RUN_AND_TELL_PEAK, str(path), str(hwm)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=300, env={"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1",
                                            "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    peak = int(hwm.read_text()) * 1024   # kB
    assert got.total - got.runtime > 80 * memory.MIB   # the arrays, not the interpreter, count
    assert 1 / FACTOR < got.total / peak < FACTOR, (got.describe(), peak / memory.MIB)
    print(f"{spec.model}: estimate {got.describe()}; peak {peak / memory.MIB:.1f} MiB")


def test_meminfo_gives_memavailable_in_bytes():
    text = "MemTotal:       24684544 kB\nMemFree: 100 kB\nMemAvailable:   21952000 kB\n"
    assert memory.parse_meminfo(text) == 21952000 * 1024
    with pytest.raises(ConfigError, match="no MemAvailable line"):
        memory.parse_meminfo("MemTotal: 1 kB\n")
    assert 0 < memory.mem_available() < os.sysconf("SC_PAGE_SIZE") * os.sysconf(
        "SC_PHYS_PAGES")


def test_a_host_short_of_its_ranks_estimate_is_named_with_its_memavailable():
    need = memory.MemoryEstimate(parameters=50 * memory.MIB, gradients=50 * memory.MIB,
                                 optimizer_state=100 * memory.MIB, activations=60 * memory.MIB)
    memory.check_fits(need, 2, {"a": 1001 * memory.MIB})
    with pytest.raises(ConfigError) as err:
        memory.check_fits(need, 2, {"a": 1001 * memory.MIB, "b": 999 * memory.MIB})
    assert str(err.value).startswith(
        "the job does not fit in memory: 2 rank(s) per host need 1000.0 MiB, 500.0 MiB per "
        "rank (parameters 50.0, gradients 50.0, optimizer state 100.0, activations 60.0, "
        "first-step flat copies 200.0, interpreter 40.0 MiB); host b has MemAvailable 999.0 "
        "MiB (/proc/meminfo).")


def test_the_data_a_rank_reads_into_memory_counts_and_mapped_data_does_not(tmp_path):
    """Text: 8 bytes (an int64 token) a character; a CSV: its features in the model's dtype
    and an int64 label a row; a compressed .npz member: read whole; an .npy stream and a
    stored .npz member: memory-mapped (0); a path this process cannot see: 0."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n" * 100)     # 1,200 bytes
    (corpus / "b.txt").write_text("x" * 300)
    (tmp_path / "val.txt").write_text("y" * 50)
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,c,label\n" + "0.5,1,2,0\n" * 10 + "\n1,2,3,1\n")
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.arange(1000))
    np.savez(tmp_path / "stored.npz", x=np.zeros((10, 4)), y=np.zeros(10, np.int64))
    np.savez_compressed(tmp_path / "packed.npz", x=np.zeros((10, 4)), y=np.zeros(10, np.int64))
    text = {"model": "transformer", "tokenizer": "char"}
    cases = [
        ({**text, "data": str(corpus)}, 8 * 1500),
        ({**text, "data": str(corpus), "eval_data": str(tmp_path / "val.txt")}, 8 * 1550),
        ({**text, "data": str(tokens)}, 0),
        ({"model": "mlp", "data": str(rows)}, 11 * (3 * 4 + 8)),
        ({"model": "mlp", "data": str(rows), "dtype": "float64"}, 11 * (3 * 8 + 8)),
        ({"model": "mlp", "data": str(tmp_path / "stored.npz")}, 0),
        # each member's .npy file, its 128-byte header too
        ({"model": "mlp", "data": str(tmp_path / "packed.npz")}, 10 * 4 * 8 + 10 * 8 + 2 * 128),
        ({**text, "data": str(tmp_path / "elsewhere.txt")}, 0),
        ({"model": "mlp"}, 0),
    ]
    for fields, want in cases:
        assert memory.data_bytes(JobSpec.from_dict(fields)) == want, fields
    spec = JobSpec.from_dict({**text, "data": str(corpus), "checkpoint_dir": None,
                              "model_args": {"vocab_size": 32, "seq_len": 8,
                                             "hidden_size": 8, "num_heads": 2,
                                             "num_layers": 1}})
    got = memory.estimate(spec, world_size=1)
    assert got.data == 8 * 1500 and "data 0.0" in got.describe()
    assert got.total == 2 * got.flat_copies + got.activations + got.data + got.runtime
