"""Worker: make ring 91 with a c_comm_init startup program, run every case of the collective
op tests (cases.json + inputs.npz, written by tests/runtime/ops/test_collective_ops.py) on
it and write what came out to ops<rank>.npz. ``run_case`` also serves the test's ring of one.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root

import ringflow as rf
from ringflow.distributed.collective.registry import destroy_ring, get_ring
from ringflow.errors import RingflowError
from ringflow.executor import Executor, Scope
from ringflow.framework.registry import get_op_def, grad_var_name
from ringflow.framework.verify import verify

RING_ID = 91


def array_key(case: str, rank: int, slot: str, i: int = 0) -> str:
    """Where the test puts rank ``rank``'s array for ``slot`` (an input, or ``Out@GRAD``)."""
    return f"{case}/{rank}/{slot}/{i}"


def _build(case: Mapping, arrays: Mapping[str, np.ndarray], rank: int):
    """(program, op, feed): the case's op over data variables holding this rank's arrays."""
    program = rf.Program()
    block = program.global_block()
    declare = case.get("declare", {})
    feed, ins = {}, {}
    for slot, count in case["inputs"].items():
        ins[slot] = []
        for i in range(count):
            value = arrays[array_key(case["name"], rank, slot, i)]
            name = f"{slot.lower()}{i}"
            block.create_var(name=name, shape=declare.get(slot, list(value.shape)),
                             dtype=value.dtype, is_data=True)
            feed[name] = value
            ins[slot].append(name)
    if case.get("inplace"):
        outs = {"Out": list(ins["X"])}
    else:
        outs = {slot: [f"{slot.lower()}_out{i}" for i in range(n)]
                for slot, n in case["outputs"].items()}
    op = block.append_op(case["op"], inputs=ins, outputs=outs, attrs=case["attrs"][rank])
    return program, op, feed


def _append_grad_ops(case: Mapping, arrays: Mapping, rank: int, program, op, feed) -> None:
    """The grad maker's ops, fed with this rank's Out@GRAD for every output they read."""
    block = program.global_block()
    descs = get_op_def(op.type).grad(op, frozenset())
    read = {n for d in descs for names in d.inputs.values() for n in names}
    for slot, names in op.outputs.items():
        for i, name in enumerate(names):
            if grad_var_name(name) in read:
                var = block.var(name)
                block.create_var(name=grad_var_name(name), shape=var.shape, dtype=var.dtype,
                                 is_data=True)
                feed[grad_var_name(name)] = arrays[array_key(case["name"], rank,
                                                             f"{slot}@GRAD", i)]
    for d in descs:
        block.append_op(d.type, inputs=d.inputs, outputs=d.outputs, attrs=d.attrs)


def run_case(case: Mapping, arrays: Mapping[str, np.ndarray], rank: int) -> dict:
    """Runs one case on this rank: its op (and, with ``wrt``, its grad ops) in a fresh scope.

    Returns ``<case>/<slot>/<i>`` for every output, ``<case>/<slot>@GRAD/<i>`` for every
    ``wrt`` input, ``<case>/after/<slot>/<i>`` for every fed input array as it is after the
    run (the op must not have written into it), or ``<case>/error`` with the message of the
    ringflow error the run raised."""
    name = case["name"]
    try:
        program, op, feed = _build(case, arrays, rank)
        if case.get("wrt"):
            _append_grad_ops(case, arrays, rank, program, op, feed)
        verify(program)
        fetch = [n for names in op.outputs.values() for n in names]
        fetch += [grad_var_name(n) for slot in case.get("wrt", []) for n in op.inputs[slot]]
        values = Executor().run(program, feed=dict(feed), fetch_list=fetch, scope=Scope())
    except RingflowError as exc:
        return {f"{name}/error": np.array(str(exc))}
    got = dict(zip(fetch, values))
    block = program.global_block()
    for var_name, value in got.items():
        var = block.var(var_name)
        assert len(var.shape) == value.ndim and var.dtype == value.dtype.name and all(
            d in (-1, s) for d, s in zip(var.shape, value.shape)), (
            f"{name}: {var_name} inferred {var.dtype}{var.shape}, kernel made "
            f"{value.dtype}{list(value.shape)}")
    out = {}
    for slot, names in op.outputs.items():
        out.update({f"{name}/{slot}/{i}": got[n] for i, n in enumerate(names)})
    for slot in case.get("wrt", []):
        out.update({f"{name}/{slot}@GRAD/{i}": got[grad_var_name(n)]
                    for i, n in enumerate(op.inputs[slot])})
    for slot, names in op.inputs.items():
        out.update({f"{name}/after/{slot}/{i}": feed[n] for i, n in enumerate(names)})
    return out


def make_ring(rank: int, endpoints: str, nranks: int) -> dict:
    """Ring RING_ID from a startup program's c_comm_init, run twice (a rerun keeps the ring)."""
    startup = rf.Program()
    startup.global_block().append_op("c_comm_init", attrs={
        "ring_id": RING_ID, "rank": rank, "nranks": nranks, "endpoints": endpoints})
    Executor().run(startup, scope=Scope())
    first = get_ring(RING_ID)
    Executor().run(startup, scope=Scope())
    return {"ring/rank": np.array(first.rank), "ring/nranks": np.array(first.nranks),
            "ring/kept": np.array(get_ring(RING_ID) is first)}


def main() -> None:
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    nranks = int(os.environ["PADDLE_TRAINERS_NUM"])
    cases = json.loads(Path("cases.json").read_text())
    arrays = dict(np.load("inputs.npz"))
    out = make_ring(rank, os.environ["PADDLE_TRAINER_ENDPOINTS"], nranks)
    for case in cases:
        out.update(run_case(case, arrays, rank))
    np.savez(f"ops{rank}.npz", **out)
    destroy_ring(RING_ID)
    print(f"rank {rank} ran {len(cases)} cases", flush=True)


if __name__ == "__main__":
    main()
