"""Collective program ops on a ring of one (this process, ring 90) and of two (two workers,
started once for all cases, ring 91 made by c_comm_init): forwards, gradients and errors.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

import ringflow as rf
from ringflow.distributed.collective.registry import destroy_ring, get_ring, has_ring, init_ring
from ringflow.errors import ConfigError, ProgramError
from ringflow.executor import Executor, Scope
from ringflow.framework.registry import OpDesc, get_op_def
from tests.runtime.distributed.spawn import Spawner, free_ports
from tests.runtime.distributed.workers.collective_ops import RING_ID, array_key, run_case

RING_OF_ONE = 90
WORKER_ENV = {"RINGFLOW_COMM_TIMEOUT": "20", "RINGFLOW_RENDEZVOUS_TIMEOUT": "20"}


@dataclass
class Case:
    """One op run on every rank of a ring: ``inputs[r]`` and ``attrs[r]`` are rank r's;
    ``ref`` maps all ranks' inputs to each rank's outputs; ``loss`` and ``wrt`` give the
    kinds ("local" or "replicated") of the outputs in L and the inputs differentiated."""

    name: str
    op: str
    inputs: list[dict]
    attrs: list[dict]
    ref: Callable[[list[dict]], list[dict]] | None = None
    loss: dict[str, str] = field(default_factory=dict)
    wrt: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, int] | None = None
    inplace: bool = False
    declare: dict[str, list[int]] = field(default_factory=dict)
    error: tuple[str, ...] = ()

    def spec(self) -> dict:
        """What the worker needs (the arrays go separately)."""
        opdef = get_op_def(self.op)
        outputs = self.outputs or {s.name: 1 for s in opdef.outputs if not s.optional}
        return {"name": self.name, "op": self.op, "attrs": self.attrs, "outputs": outputs,
                "inputs": {slot: len(_as_list(v)) for slot, v in self.inputs[0].items()},
                "wrt": list(self.wrt), "inplace": self.inplace, "declare": self.declare}


def _as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


# numpy references: all ranks' inputs -> each rank's outputs ----------------------------------
def _reduced(ufunc):
    return lambda xs: [{"Out": ufunc.reduce(np.stack([x["X"] for x in xs]))}] * len(xs)


def _from_root(root):
    return lambda xs: [{"Out": xs[root]["X"]}] * len(xs)


def _own(xs):
    return [{"Out": x["X"]} for x in xs]


def _joined(axis):
    return lambda xs: [{"Out": np.concatenate([x["X"] for x in xs], axis=axis)}] * len(xs)


def _own_columns(xs):
    n = len(xs)
    w = xs[0]["X"].shape[-1] // n
    return [{"Out": x["X"][..., r * w:(r + 1) * w]} for r, x in enumerate(xs)]


def _embedded(starts):
    def ref(xs):
        outs = []
        for x, start in zip(xs, starts):
            w, local = x["W"], x["Ids"].astype(np.int64) - start
            hit = (local >= 0) & (local < w.shape[0])
            outs.append({"Out": np.where(hit[..., None], w[np.where(hit, local, 0)], 0.0)})
        return outs

    return ref


def _cross_entropy(ignore_index=-100):
    def ref(xs):
        d = xs[0]["Logits"].shape[-1]
        full = np.concatenate([x["Logits"] for x in xs], axis=-1)
        z = full - full.max(axis=-1, keepdims=True)
        log_sm = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        label = xs[0]["Label"].astype(np.int64)
        ignored = label == ignore_index
        picked = np.take_along_axis(log_sm, np.where(ignored, 0, label), axis=-1)
        loss = np.where(ignored, 0.0, -picked).astype(full.dtype)
        sm = np.exp(log_sm)
        return [{"Softmax": sm[..., r * d:(r + 1) * d], "Loss": loss} for r in range(len(xs))]

    return ref


# the cases -----------------------------------------------------------------------------------
def cases(n: int, ring: int) -> list[Case]:
    """Every case for a ring of ``n`` ranks with id ``ring``; the error cases come last and
    one all-reduce after them shows the ring still works."""
    rng = np.random.default_rng(n)

    def local(*shape, dtype=np.float64):
        return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]

    def each(xs, slot="X"):
        return [{slot: x} for x in xs]

    def same(value, slot="X"):
        return [{slot: value} for _ in range(n)]

    def attrs(**kw):
        return [{"ring_id": ring, **kw} for _ in range(n)]

    def ranked(**kw):
        return [{"ring_id": ring, "rank": r, "nranks": n, **kw} for r in range(n)]

    ids = np.array([[0, 1, 3 * n - 1], [3 * n, 1, -1]], np.int64)  # repeats; -1, 3n in no shard
    labels = np.array([[0], [3 * n - 1], [-100], [1]], np.int64)
    big = [np.array([[1000.0, 0.0, -1000.0], [5.0, 5.0, 5.0]], np.float32) + r
           for r in range(n)]
    return [
        Case("allreduce_sum", "c_allreduce_sum", each(local(3, 4)), attrs(),
             _reduced(np.add), loss={"Out": "local"}, wrt={"X": "local"}),
        Case("allreduce_sum_int64", "c_allreduce_sum",
             each([rng.integers(-1000, 1000, 7) for _ in range(n)]), attrs(), _reduced(np.add)),
        Case("allreduce_sum_float32", "c_allreduce_sum", each(local(5, dtype=np.float32)),
             attrs(), _reduced(np.add)),
        Case("allreduce_max", "c_allreduce_max", each(local(3, 4)), attrs(), _reduced(np.maximum)),
        Case("allreduce_min", "c_allreduce_min", each(local(3, 4)), attrs(), _reduced(np.minimum)),
        Case("allreduce_prod", "c_allreduce_prod",
             each([rng.uniform(0.5, 1.5, (3, 4)) for _ in range(n)]), attrs(),
             _reduced(np.multiply)),
        Case("allreduce_sum_in_place", "c_allreduce_sum", each(local(6)), attrs(),
             _reduced(np.add), inplace=True),
        Case("broadcast_root_0", "broadcast", each(local(2, 3)), attrs(root=0), _from_root(0)),
        Case("broadcast_last_root_in_place", "broadcast", each(local(5)), attrs(root=n - 1),
             _from_root(n - 1), inplace=True),
        Case("allgather", "c_allgather", each(local(2, 3)), attrs(nranks=n), _joined(0),
             loss={"Out": "replicated"}, wrt={"X": "local"}),
        Case("sync_calc_stream", "c_sync_calc_stream", each(local(2, 3)), attrs(), _own,
             inplace=True),
        Case("sync_comm_stream", "c_sync_comm_stream",
             [{"X": [a, b]} for a, b in zip(local(2), local(3))], attrs(),
             lambda xs: [{"Out": x["X"]} for x in xs], outputs={"Out": 2}, inplace=True),
        Case("identity", "c_identity", same(rng.standard_normal((3, 4))), attrs(), _own,
             loss={"Out": "local"}, wrt={"X": "replicated"}),
        Case("mp_allreduce_sum", "mp_allreduce_sum", each(local(3, 4)), attrs(),
             _reduced(np.add), loss={"Out": "replicated"}, wrt={"X": "local"}),
        Case("concat", "c_concat", each(local(2, 3)), ranked(), _joined(-1),
             loss={"Out": "replicated"}, wrt={"X": "local"}),
        Case("split", "c_split", same(rng.standard_normal((2, 4))), ranked(), _own_columns,
             loss={"Out": "local"}, wrt={"X": "replicated"}),
        Case("split_3d", "c_split", same(rng.standard_normal((2, 1, 4))), ranked(),
             _own_columns, loss={"Out": "local"}, wrt={"X": "replicated"}),
        Case("embedding", "c_embedding",
             [{"W": w, "Ids": ids} for w in local(3, 4)],
             [{"start_index": 3 * r, "vocab_size": 3 * n} for r in range(n)],
             _embedded([3 * r for r in range(n)]), loss={"Out": "local"}, wrt={"W": "local"}),
        Case("embedding_int32_ids", "c_embedding",
             [{"W": w, "Ids": ids.astype(np.int32)} for w in local(3, 2)],
             [{"start_index": 3 * r} for r in range(n)], _embedded([3 * r for r in range(n)])),
        Case("cross_entropy", "c_softmax_with_cross_entropy",
             [{"Logits": x, "Label": labels} for x in local(4, 3)], ranked(),
             _cross_entropy(), loss={"Loss": "replicated"}, wrt={"Logits": "local"}),
        Case("cross_entropy_3d_int32", "c_softmax_with_cross_entropy",
             [{"Logits": x, "Label": np.array([[[0], [2]], [[3 * n - 1], [1]]], np.int32)}
              for x in local(2, 2, 3)], ranked(ignore_index=2), _cross_entropy(2),
             loss={"Loss": "replicated"}, wrt={"Logits": "local"}),
        Case("cross_entropy_large_float32", "c_softmax_with_cross_entropy",
             [{"Logits": x, "Label": np.array([[1], [2]], np.int64)} for x in big], ranked(),
             _cross_entropy()),
        # errors (raised before any communication, on every rank alike)
        Case("bad_label", "c_softmax_with_cross_entropy",
             [{"Logits": x, "Label": np.array([[0], [3 * n]], np.int64)} for x in local(2, 3)],
             ranked(), error=("op 0 (c_softmax_with_cross_entropy)", f"label {3 * n} is out of "
                              f"range", f"classes 0..{3 * n - 1}")),
        Case("rank_attr_disagrees", "c_concat", each(local(2, 3)),
             [{"ring_id": ring, "rank": (r + 1) % 2, "nranks": 2} for r in range(n)],
             error=("op 0 (c_concat)", "nranks=2 disagree with ring", f"of {n}")),
        *([Case("split_not_divisible_at_run_time", "c_split", same(np.ones((2, 3))),
                ranked(), declare={"X": [-1, -1]},
                error=("op 0 (c_split)", "D=3", "nranks=2"))] if n == 2 else []),
        Case("ring_missing", "c_allreduce_sum", each(local(2)), [{"ring_id": 99}] * n,
             error=("op 0 (c_allreduce_sum)", "ring 99 is not initialised")),
        Case("allreduce_after_errors", "c_allreduce_sum", each(local(4)), attrs(),
             _reduced(np.add)),
    ]


CASES = {1: cases(1, RING_OF_ONE), 2: cases(2, RING_ID)}


def _arrays(cases_: list[Case]) -> dict[str, np.ndarray]:
    """Every rank's inputs and Out@GRADs, keyed as the worker reads them; a replicated
    output gets one G on every rank."""
    arrays = {}
    for case in cases_:
        rng = np.random.default_rng(zlib.crc32(case.name.encode()))
        n = len(case.inputs)
        for r, inputs in enumerate(case.inputs):
            for slot, value in inputs.items():
                for i, a in enumerate(_as_list(value)):
                    arrays[array_key(case.name, r, slot, i)] = a
        if case.wrt:
            outs = case.ref(case.inputs)
            for slot, kind in case.loss.items():
                shared = rng.standard_normal(outs[0][slot].shape)
                for r in range(n):
                    g = shared if kind == "replicated" else rng.standard_normal(shared.shape)
                    arrays[array_key(case.name, r, f"{slot}@GRAD")] = g
    return arrays


def _gradient_of_loss(case: Case, arrays: dict, r: int, slot: str) -> np.ndarray:
    return arrays[array_key(case.name, r, f"{slot}@GRAD")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """world -> each rank's results (``run_case``'s keys), worked out once per world."""
    cache: dict[int, list[dict]] = {}

    def get(world: int) -> list[dict]:
        if world not in cache:
            cache[world] = _ring_of_one() if world == 1 else _ring_of_two(
                tmp_path_factory.mktemp("collective_ops"))
        return cache[world]

    return get


def _ring_of_one() -> list[dict]:
    init_ring(RING_OF_ONE, [f"127.0.0.1:{free_ports(1)[0]}"], 0, 1)
    try:
        arrays, out = _arrays(CASES[1]), {}
        for case in CASES[1]:
            out.update(run_case(case.spec(), arrays, 0))
        return [out]
    finally:
        destroy_ring(RING_OF_ONE)


def _ring_of_two(tmp) -> list[dict]:
    (tmp / "cases.json").write_text(json.dumps([c.spec() for c in CASES[2]]))
    np.savez(tmp / "inputs.npz", **_arrays(CASES[2]))
    spawner = Spawner(tmp)
    try:
        job = spawner("collective_ops.py", 2, env=WORKER_ENV)
        assert job.wait(timeout=60) == [0, 0], job.output()
    finally:
        spawner.close()
    return [dict(np.load(tmp / f"ops{r}.npz")) for r in range(2)]


def _params(select: Callable[[Case], bool]):
    return pytest.mark.parametrize("world,name", [
        pytest.param(w, c.name, id=f"{w}-{c.name}",
                     marks=[pytest.mark.multiproc, pytest.mark.timeout(120)] if w == 2 else [])
        for w in (1, 2) for c in CASES[w] if select(c)])


def _case(world: int, name: str) -> Case:
    return next(c for c in CASES[world] if c.name == name)


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want), (
        f"{what}: got {got.dtype}{list(got.shape)}, want {np.asarray(want).dtype}"
        f"{list(np.shape(want))}")
    if got.dtype.kind == "f":
        rtol = 1e-5 if got.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


# ring of one and ring of two -----------------------------------------------------------------
@_params(lambda c: c.ref is not None)
def test_outputs_equal_the_numpy_formula_on_every_rank(results, world, name):
    case, per_rank = _case(world, name), results(world)
    for r, want in enumerate(case.ref(case.inputs)):
        assert f"{name}/error" not in per_rank[r], per_rank[r].get(f"{name}/error")
        for slot, value in want.items():
            for i, a in enumerate(_as_list(value)):
                _close(per_rank[r][f"{name}/{slot}/{i}"], a, f"{name} rank {r} {slot}[{i}]")


@_params(lambda c: c.ref is not None)
def test_fed_inputs_are_never_written_even_in_place(results, world, name):
    case, per_rank = _case(world, name), results(world)
    for r, inputs in enumerate(case.inputs):
        for slot, value in inputs.items():
            for i, a in enumerate(_as_list(value)):
                np.testing.assert_array_equal(per_rank[r][f"{name}/after/{slot}/{i}"], a,
                                              err_msg=f"{name} rank {r} {slot}[{i}]")


def _objective(case: Case, xs: list[dict], arrays: dict) -> float:
    outs = case.ref(xs)
    total = 0.0
    for slot, kind in case.loss.items():
        ranks = [0] if kind == "replicated" else range(len(xs))
        total += sum(float(np.sum(outs[r][slot] * _gradient_of_loss(case, arrays, r, slot)))
                     for r in ranks)
    return total


def _numeric_gradient(case: Case, slot: str, kind: str, arrays: dict,
                      eps: float = 1e-6) -> list[np.ndarray]:
    """Each rank's dL/dX by central differences: a local X moves on one rank, a replicated
    X on every rank at once (see test_gradients_equal_central_differences)."""
    n = len(case.inputs)
    groups = [list(range(n))] if kind == "replicated" else [[r] for r in range(n)]
    grads = [np.zeros(x[slot].shape) for x in case.inputs]
    for group in groups:
        for idx in np.ndindex(grads[0].shape):
            values = []
            for step in (eps, -eps):
                xs = [dict(x) for x in case.inputs]
                for r in group:
                    xs[r][slot] = xs[r][slot].copy()
                    xs[r][slot][idx] += step
                values.append(_objective(case, xs, arrays))
            for r in group:
                grads[r][idx] = (values[0] - values[1]) / (2 * eps)
    return grads


@_params(lambda c: bool(c.wrt))
def test_gradients_equal_central_differences(results, world, name):
    """Each rank's X@GRAD equals dL/dX by central differences in float64.

    The gradient check on a ring: every value is rank-local (rank r holds its own X_r) or
    replicated (one value X that every rank holds). L is one number, the same on every rank,
    computed here with numpy from all ranks' inputs, summed over the outputs in ``loss``:

        <Out, G>              for a replicated output
        sum_r <Out_r, G_r>    for a rank-local output

    where G_r is the Out@GRAD fed on rank r (one G on every rank for a replicated output: the
    loss is computed once from it). Rank r's X@GRAD must be dL/dX_r for a rank-local input,
    and dL/dX, moving X on every rank at once, for a replicated one. The Megatron-style ops
    are then c_identity and c_split (replicated -> local), mp_allreduce_sum, c_concat and
    c_allgather (local -> replicated), c_softmax_with_cross_entropy (local Logits ->
    replicated Loss); c_allreduce_sum is the data-parallel convention (local -> local: the
    total loss is the sum over ranks of every rank's loss).
    """
    case, per_rank = _case(world, name), results(world)
    arrays = _arrays([case])
    for slot, kind in case.wrt.items():
        numeric = _numeric_gradient(case, slot, kind, arrays)
        for r, want in enumerate(numeric):
            got = per_rank[r][f"{name}/{slot}@GRAD/0"]
            assert got.dtype == np.float64 and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8,
                                       err_msg=f"{name}: rank {r} {slot}@GRAD")


@_params(lambda c: bool(c.error))
def test_errors_name_the_op_and_the_values(results, world, name):
    case, per_rank = _case(world, name), results(world)
    for r in range(world):
        message = str(per_rank[r].get(f"{name}/error", "no error was raised"))
        for part in case.error:
            assert part in message, f"rank {r}: {part!r} not in {message!r}"


# ring of two only ------------------------------------------------------------------------------
REPLICATED = ["allreduce_sum", "allreduce_max", "allreduce_prod", "allgather",
              "mp_allreduce_sum", "concat", "cross_entropy", "cross_entropy_3d_int32",
              "cross_entropy_large_float32"]


@pytest.mark.multiproc
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", REPLICATED)
def test_replicated_outputs_are_bitwise_identical_on_both_ranks(results, name):
    per_rank = results(2)
    slot = "Loss" if "cross_entropy" in name else "Out"
    first, second = per_rank[0][f"{name}/{slot}/0"], per_rank[1][f"{name}/{slot}/0"]
    assert first.dtype == second.dtype and first.tobytes() == second.tobytes()


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_c_comm_init_makes_the_ring_and_a_rerun_keeps_it(results):
    per_rank = results(2)
    assert [(int(p["ring/rank"]), int(p["ring/nranks"]), bool(p["ring/kept"]))
            for p in per_rank] == [(0, 2, True), (1, 2, True)]


# this process only -----------------------------------------------------------------------------
GRAD_OPS = {  # forward op -> its grad op, as Paddle (c_split: c_concat, not c_allgather)
    "c_allreduce_sum": "c_allreduce_sum", "c_identity": "c_allreduce_sum",
    "mp_allreduce_sum": "c_identity", "c_concat": "c_split", "c_split": "c_concat",
}


@pytest.mark.parametrize("op_type", GRAD_OPS)
def test_grad_op_is_the_conjugate_collective_on_the_same_ring(op_type):
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[2, 4], dtype="float64", is_data=True)
    op = block.append_op(op_type, inputs={"X": "x"}, outputs={"Out": "y"},
                         attrs={"ring_id": 7})
    [desc] = get_op_def(op_type).grad(op, frozenset())
    assert desc == OpDesc(GRAD_OPS[op_type], {"X": ["y@GRAD"]}, {"Out": ["x@GRAD"]},
                          {k: op.attr(k) for k in get_op_def(GRAD_OPS[op_type]).attrs})
    assert desc.attrs["ring_id"] == 7
    assert get_op_def(op_type).grad(op, frozenset({"x"})) == []


@pytest.mark.parametrize("op_type", ["c_allreduce_max", "c_allreduce_min", "c_allreduce_prod",
                                     "broadcast", "c_sync_calc_stream", "c_sync_comm_stream"])
def test_ops_without_gradient(op_type):
    assert get_op_def(op_type).grad is None


def test_sync_ops_hand_on_the_very_input_arrays(ring_of_one):
    program = rf.Program()
    block = program.global_block()
    for name in ("a", "b"):
        block.create_var(name=name, shape=[3], dtype="float64", is_data=True)
    block.append_op("c_sync_calc_stream", inputs={"X": "a"}, outputs={"Out": "a"},
                    attrs={"ring_id": ring_of_one})
    block.append_op("c_sync_comm_stream", inputs={"X": ["a", "b"]},
                    outputs={"Out": ["a", "b"]}, attrs={"ring_id": ring_of_one})
    scope, a, b = Scope(), np.arange(3.0), np.ones(3)
    Executor().run(program, feed={"a": a, "b": b}, scope=scope)
    assert scope["a"] is a and scope["b"] is b


@pytest.fixture
def ring_of_one():
    init_ring(RING_OF_ONE, [f"127.0.0.1:{free_ports(1)[0]}"], 0, 1)
    try:
        yield RING_OF_ONE
    finally:
        destroy_ring(RING_OF_ONE)


def _comm_init(**attrs) -> None:
    startup = rf.Program()
    startup.global_block().append_op("c_comm_init", attrs=attrs)
    Executor().run(startup, scope=Scope())


def test_c_comm_init_makes_a_ring_of_one_that_a_rerun_keeps():
    endpoint = f"127.0.0.1:{free_ports(1)[0]}"
    try:
        _comm_init(ring_id=92, rank=0, nranks=1, endpoints=endpoint)
        ring = get_ring(92)
        _comm_init(ring_id=92, rank=0, nranks=1, endpoints=endpoint)
        assert get_ring(92) is ring
        assert (ring.ring_id, ring.rank, ring.nranks, [str(e) for e in ring.endpoints]) == (
            92, 0, 1, [endpoint])
    finally:
        destroy_ring(92)


@pytest.mark.parametrize("attrs,parts", [
    ({"nranks": 2, "endpoints": "127.0.0.1:6170"},
     ["rank=0, nranks=2", "endpoints='127.0.0.1:6170' (1 endpoints)"]),
    ({"nranks": 1, "endpoints": ""}, ["nranks=1", "endpoints='' (0 endpoints)"]),
    ({"rank": 1, "nranks": 1, "endpoints": "127.0.0.1:6170"}, ["rank=1, nranks=1"]),
    ({"ring_id": 100, "endpoints": "127.0.0.1:6170"}, ["ring_id=100", "0-99"]),
])
def test_c_comm_init_rejects_members_that_do_not_fit(attrs, parts):
    with pytest.raises(ConfigError) as err:
        _comm_init(**{"ring_id": 93, **attrs})
    assert "op 0 (c_comm_init)" in str(err.value)
    for part in parts:
        assert part in str(err.value)
    assert not has_ring(93) and not has_ring(100)


def test_c_split_of_a_last_dim_not_divisible_fails_when_built():
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[2, 5], dtype="float64", is_data=True)
    with pytest.raises(ProgramError, match=r"D=5 of X is not divisible by nranks=2"):
        block.append_op("c_split", inputs={"X": "x"}, outputs={"Out": "y"},
                        attrs={"rank": 0, "nranks": 2})


def test_cross_entropy_label_must_be_one_int_per_row_when_built():
    block = rf.Program().global_block()
    block.create_var(name="logits", shape=[-1, 3], dtype="float64", is_data=True)
    block.create_var(name="label", shape=[-1], dtype="int64", is_data=True)
    with pytest.raises(ProgramError, match=r"Label is int64\[-1\].*int64 \(or int32\) \[-1, 1\]"):
        block.append_op("c_softmax_with_cross_entropy",
                        inputs={"Logits": "logits", "Label": "label"},
                        outputs={"Softmax": "sm", "Loss": "loss"})
