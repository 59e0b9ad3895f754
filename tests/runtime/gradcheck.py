"""Checking one op at a time, without append_backward: run its kernel, compare its
inferred output metas with what the kernel produced (and ``verify`` the program), and
compare the gradients its grad maker's ops compute with central finite differences in
float64.

``check_grad`` builds [forward op, grad ops from ``get_op_def(type).grad(op, {})``], feeds
random ``Out@GRAD`` for every output the grad ops read, and compares each ``X@GRAD`` with
d/dX sum(Out * Out@GRAD), differenced element by element on a forward-only program.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from ringflow.executor import Executor, Scope
from ringflow.framework.program import Program
from ringflow.framework.registry import GRAD_SUFFIX, get_op_def, grad_var_name
from ringflow.framework.verify import verify

Arrays = Mapping[str, "np.ndarray | list[np.ndarray]"]


def _as_list(v) -> list[np.ndarray]:
    return [np.asarray(a) for a in v] if isinstance(v, (list, tuple)) else [np.asarray(v)]


def build(op_type: str, inputs: Arrays, attrs: Mapping | None = None,
          outputs: Mapping[str, int] | Iterable[str] | None = None,
          batch_unknown: bool | Iterable[str] = False):
    """A program holding one ``op_type`` op over data variables shaped like ``inputs``.

    ``outputs``: output slots to bind (a dict gives a count for duplicable slots); default
    every required output slot. ``batch_unknown`` declares dim 0 of the inputs (of the
    named slots, or all when True) as -1.
    Returns (program, op, feed)."""
    opdef = get_op_def(op_type)
    if outputs is None:
        outputs = [s.name for s in opdef.outputs if not s.optional]
    counts = dict(outputs) if isinstance(outputs, Mapping) else dict.fromkeys(outputs, 1)
    program = Program()
    block = program.global_block()
    feed, ins = {}, {}
    for slot, value in inputs.items():
        ins[slot] = []
        for i, arr in enumerate(_as_list(value)):
            name = f"{slot.lower()}{i}"
            shape = list(arr.shape)
            if shape and (batch_unknown is True or (
                    batch_unknown and slot in batch_unknown)):
                shape[0] = -1
            block.create_var(name=name, shape=shape, dtype=arr.dtype, is_data=True)
            feed[name] = arr
            ins[slot].append(name)
    outs = {slot: [f"{slot.lower()}_out{i}" for i in range(n)] for slot, n in counts.items()}
    op = block.append_op(op_type, inputs=ins, outputs=outs, attrs=dict(attrs or {}))
    return program, op, feed


def run_program(program: Program, feed: Mapping, fetch: list[str]) -> list[np.ndarray]:
    # A fresh executor each time: random ops (dropout) then draw the same numbers.
    return Executor().run(program, feed=dict(feed), fetch_list=fetch, scope=Scope())


def forward(op_type: str, inputs: Arrays, attrs: Mapping | None = None,
            outputs: Mapping[str, int] | Iterable[str] | None = None) -> dict[str, list]:
    """Runs one op; returns slot -> output arrays. Also asserts that shape inference gave
    each output variable the shape and dtype the kernel produced."""
    program, op, feed = build(op_type, inputs, attrs, outputs)
    verify(program)
    names = [n for ns in op.outputs.values() for n in ns]
    values = dict(zip(names, run_program(program, feed, names)))
    block = program.global_block()
    for name, value in values.items():
        var = block.var(name)
        meta, got = (var.shape, var.dtype), (value.shape, value.dtype.name)
        assert meta == got, f"{op_type}: {name} inferred {meta}, kernel made {got}"
    return {slot: [values[n] for n in ns] for slot, ns in op.outputs.items()}


def _objective(program: Program, feed: Mapping, douts: Mapping[str, np.ndarray]) -> float:
    outs = run_program(program, feed, list(douts))
    return float(sum(np.sum(o * d) for o, d in zip(outs, douts.values())))


def check_grad(op_type: str, inputs: Arrays, attrs: Mapping | None = None,
               outputs: Mapping[str, int] | Iterable[str] | None = None,
               wrt: Iterable[str] | None = None, rtol: float = 1e-5, atol: float = 1e-8,
               eps: float = 1e-6, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Asserts that the grad ops' gradients of the ``wrt`` input slots (default: every
    float input) match central differences; returns them (slot -> arrays)."""
    program, op, feed = build(op_type, inputs, attrs, outputs)
    douts = _append_grad_ops(program, op, np.random.default_rng(seed))
    if wrt is None:
        wrt = [s for s, v in inputs.items() if all(a.dtype.kind == "f" for a in _as_list(v))]
    names = {slot: op.inputs[slot] for slot in wrt}
    fetch = [grad_var_name(n) for ns in names.values() for n in ns]
    grad_feed = {**feed, **{grad_var_name(k): v for k, v in douts.items()}}
    analytic = dict(zip(fetch, run_program(program, grad_feed, fetch)))
    block = program.global_block()
    fwd_program, _, _ = build(op_type, inputs, attrs, outputs)
    result = {}
    for slot, ns in names.items():
        result[slot] = []
        for n in ns:
            got = analytic[grad_var_name(n)]
            assert got.shape == feed[n].shape and got.dtype == feed[n].dtype, (
                f"{op_type}: {n}{GRAD_SUFFIX} is {got.dtype}{got.shape}, "
                f"input is {feed[n].dtype}{feed[n].shape}")
            assert block.var(grad_var_name(n)).shape == feed[n].shape
            numeric = _numeric_grad(fwd_program, feed, n, douts, eps)
            np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol,
                                       err_msg=f"{op_type}: gradient of {slot} ({n})")
            result[slot].append(got)
    return result


def _append_grad_ops(program: Program, op, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Appends the grad maker's ops after ``op``; returns a random gradient for each output
    whose gradient they read (forward output name -> array), declared as fed data."""
    block = program.global_block()
    descs = get_op_def(op.type).grad(op, frozenset())
    assert descs, f"{op.type}: the grad maker made no grad op"
    douts = {}
    for name in (n for ns in op.outputs.values() for n in ns):
        if any(grad_var_name(name) in ns for d in descs for ns in d.inputs.values()):
            var = block.var(name)
            block.create_var(name=grad_var_name(name), shape=var.shape, dtype=var.dtype,
                             is_data=True)
            douts[name] = rng.standard_normal(var.shape).astype(var.dtype)
    for d in descs:
        block.append_op(d.type, inputs=d.inputs, outputs=d.outputs, attrs=d.attrs)
    verify(program)     # the grad ops' shape inference agrees with the variables
    return douts


def _numeric_grad(program: Program, feed: Mapping, name: str, douts, eps: float) -> np.ndarray:
    base = feed[name]
    grad = np.zeros(base.shape, np.float64)
    for idx in np.ndindex(base.shape):
        values = []
        for sign in (1.0, -1.0):
            moved = base.copy()
            moved[idx] += sign * eps
            values.append(_objective(program, {**feed, name: moved}, douts))
        grad[idx] = (values[0] - values[1]) / (2 * eps)
    return grad
