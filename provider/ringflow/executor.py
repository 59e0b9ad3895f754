"""The numpy executor: the reference semantics of every program.

``Executor.run`` is a short loop: for each step of the prepared program, let its kernel
read its inputs from the scope and write its outputs back. A step is a program op with its
kernel from the op table, or a fused op or gradient-bucket step that ``ringflow.compiler``
put in their place (``BuildStrategy``; ``Executor.prepared`` shows the plan). Everything
else here is checking (feeds, the dtype of the state a program reads, NaN/inf), the small
context kernels see, and the one ownership rule: the executor mutates or reuses only arrays
it made or adopted (``owns``), never one a user put into the scope.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ExecutionError, RingflowError
from .framework.printer import op_to_string
from .framework.program import Operator, Program, Variable, default_main_program
from .framework.registry import EMPTY_VAR_NAME

if TYPE_CHECKING:
    from .compiler import BuildStrategy, CompiledProgram, Plan
    from .compiler.comm_stream import CommStream


class Scope:
    """Variable name -> ndarray. ``scope[name]`` reads, ``scope[name] = value`` sets."""

    def __init__(self) -> None:
        self._vars: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._vars[name]
        except KeyError:
            raise KeyError(f"variable {name!r} is not in the scope") from None

    def __setitem__(self, name: str, value: Any) -> None:
        self._vars[name] = np.asarray(value)

    def __contains__(self, name: object) -> bool:
        return name in self._vars

    def __delitem__(self, name: str) -> None:
        del self._vars[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)

    def get(self, name: str, default: Any = None) -> Any:
        return self._vars.get(name, default)

    def keys(self) -> list[str]:
        return list(self._vars)

    def find_var(self, name: str) -> np.ndarray | None:
        return self._vars.get(name)

    def drop(self, names: Iterable[str]) -> None:
        for n in names:
            self._vars.pop(n, None)


_global_scope = Scope()


def global_scope() -> Scope:
    return _global_scope


class KernelContext:
    """What a kernel sees: its op's inputs (arrays from the scope), attrs, outputs."""

    __slots__ = ("executor", "index", "op", "scope")

    def __init__(self, executor: Executor, op: Operator, index: int, scope: Scope) -> None:
        self.executor = executor
        self.op = op
        self.index = index
        self.scope = scope

    def _get(self, name: str) -> np.ndarray:
        try:
            return self.scope._vars[name]
        except KeyError:
            var = self.op.block._find_var_recursive(name)
            if var is not None and var.is_data:
                hint = f"data variable {name!r} is not fed: pass feed={{{name!r}: array}}"
            elif var is not None and var.persistable:
                hint = f"persistable variable {name!r} has no value: run the startup program"
            else:
                hint = f"input variable {name!r} has no value: nothing earlier produced it"
            raise ExecutionError(f"op {self.index} ({self.op.type}): {hint}") from None

    def input(self, slot: str, i: int = 0) -> np.ndarray:
        return self._get(self.op.inputs[slot][i])

    def inputs(self, slot: str) -> list[np.ndarray]:
        return [self._get(n) for n in self.op.inputs.get(slot, ())]

    def has_input(self, slot: str) -> bool:
        return bool(self.op.inputs.get(slot))

    def has_output(self, slot: str, i: int = 0) -> bool:
        names = self.op.outputs.get(slot, ())
        return i < len(names) and names[i] != EMPTY_VAR_NAME

    def attr(self, name: str) -> Any:
        return self.op.attrs.get(name)

    def set_output(self, slot: str, value: Any, i: int = 0) -> None:
        names = self.op.outputs.get(slot, ())
        if i < len(names) and names[i] != EMPTY_VAR_NAME:
            self.scope._vars[names[i]] = np.asarray(value)

    def set_outputs(self, slot: str, values: Iterable[Any]) -> None:
        for i, v in enumerate(values):
            self.set_output(slot, v, i)

    def buffer(self, slot: str, shape: tuple[int, ...], dtype: Any, i: int = 0) -> np.ndarray:
        """An output array to write into: last run's value of this output if it has the
        same shape and dtype (no new allocation, no page faults), else a fresh one.

        The kernel must write every element and then ``set_output`` it."""
        name = self.op.outputs[slot][i]
        old = self.scope._vars.get(name)
        # Reuse only the very array this executor made or adopted for the name: an array the
        # user assigned to the scope (or another op's view) is never written behind its back.
        if (old is not None and self.executor.owns(name, old)
                and old.shape == tuple(shape) and old.dtype == dtype):
            return old
        fresh = np.empty(shape, dtype)
        self.executor.adopt(name, fresh)
        return fresh

    def rng(self) -> np.random.Generator:
        """A generator for random ops (dropout): a pure function of the program's seed, the
        op's ``seed`` attr and how many times this program has run. An op without a seed
        attr falls back to its index, which a rewrite that inserts ops changes: layers
        therefore give random ops a seed (``stable_seed`` of the program seed and a name)."""
        program = self.op.block.program
        seed = self.op.attrs.get("seed") or 0
        step = self.executor._run_counts.get(id(program), 0)
        where = seed if seed else 1 << 32 | self.index
        key = [program.random_seed, where, step]
        return np.random.default_rng([int(k) & 0xFFFFFFFFFFFF for k in key])


def _check_finite(ctx: KernelContext) -> None:
    for slot, names in ctx.op.outputs.items():
        for n in names:
            v = ctx.scope._vars.get(n)
            if v is not None and v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                bad = "NaN" if np.isnan(v).any() else "inf"
                raise ExecutionError(
                    f"op {ctx.index} ({ctx.op.type}) produced {bad} in output {slot}={n!r} "
                    f"(RINGFLOW_CHECK_NAN=1): {op_to_string(ctx.op)}")


# block -> (program version, the persistable variables its ops read before writing them)
_STATE_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state_reads(block) -> list[tuple[Variable, np.dtype]]:
    """The persistable variables the ops read before any op writes them (the state:
    parameters, optimizer moments), worked out once per version of the program."""
    version = block.program._version
    cached = _STATE_READS.get(block)
    if cached is not None and cached[0] == version:
        return cached[1]
    written: set[str] = set()
    reads: dict[str, tuple[Variable, np.dtype]] = {}
    for op in block.ops:
        for name in op.input_arg_names:
            var = block.vars.get(name)
            if name not in written and var is not None and var.persistable:
                reads.setdefault(name, (var, np.dtype(var.dtype)))
        written.update(op.output_arg_names)
    _STATE_READS[block] = (version, list(reads.values()))
    return _STATE_READS[block][1]


def _check_persistables(block, scope: Scope) -> None:
    """The state a program reads must have its declared dtype in the scope: an array set
    by hand (``scope["w"] = np.zeros(...)``, float64 by default) would otherwise turn every
    op after it into float64 without a word. What the program writes first (a startup
    program's variables) may hold anything before it runs."""
    values = scope._vars
    for var, dtype in _state_reads(block):
        value = values.get(var.name)
        if value is not None and value.dtype is not dtype and value.dtype != dtype:
            raise ExecutionError(
                f"persistable variable {var.name!r} is {value.dtype.name}{list(value.shape)} "
                f"in the scope, the program declares {var.dtype}{list(var.shape or [])}: set "
                f"it with an array of dtype {var.dtype}")


class Executor:
    """Runs programs on numpy. ``place`` is accepted for Paddle compatibility (CPU only)."""

    def __init__(self, place: Any = None, profile: bool | None = None) -> None:
        self.place = place
        # The arrays this executor made or adopted, by variable name: the only ones a
        # kernel reuses as an output buffer or updates in place (``owns``).
        self._owned: dict[str, np.ndarray] = {}
        self._run_counts: dict[int, int] = {}
        # program -> {(version, strategy, fetch names): Plan}
        self._plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._streams: dict[int, CommStream] = {}
        # scope -> the flat buffers of fused update steps (compiler/fuse_optimizer.py)
        self._flat_state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Opt-in per-op timing (``profile=True`` or RINGFLOW_PROFILE=1): op type ->
        # [calls, seconds inside its kernel]; read with ``profile_stats()``.
        if profile is None:
            profile = os.environ.get("RINGFLOW_PROFILE") == "1"
        self.profile = bool(profile)
        self._op_times: dict[str, list] = {}

    def run(
        self,
        program: Program | CompiledProgram | None = None,
        feed: Mapping[str, Any] | None = None,
        fetch_list: Iterable[Variable | str] | None = None,
        scope: Scope | None = None,
        return_numpy: bool = True,
    ) -> list[Any]:
        """Runs ``program`` (default: the default main program; a ``CompiledProgram`` runs
        with its ``BuildStrategy``, a plain Program with the default one) on ``scope``
        (default: the global scope) after writing ``feed`` into it; returns copies of the
        ``fetch_list`` values as ndarrays (``return_numpy`` is accepted for Paddle; there is
        nothing else to return). A scheduler attached to the program sets the learning rate
        first and is stepped after the run (not for ``clone(for_test=True)`` programs)."""
        program, strategy = _program_and_strategy(program)
        scope = scope if scope is not None else global_scope()
        block = program.global_block()
        fetch_names = [f.name if isinstance(f, Variable) else str(f) for f in fetch_list or ()]
        for name in fetch_names:
            if block._find_var_recursive(name) is None:
                raise ExecutionError(f"fetch target {name!r} is not a variable of the program")
        plan = self._plan(program, strategy, fetch_names)
        self._feed(block, feed or {}, scope)
        self._apply_lr_scheduler(program, scope)
        _check_persistables(block, scope)
        self._run_steps(plan, scope)
        runs = self._run_counts[id(program)] = self._run_counts.get(id(program), 0) + 1
        if program.lr_scheduler is not None and not program._is_test \
                and runs % program.runs_per_step == 0:
            program.lr_scheduler.step()
        missing = [name for name in fetch_names if name not in scope]
        if missing:
            raise ExecutionError(f"fetch target {missing[0]!r} was not computed by the program")
        return [np.array(scope[name], copy=True) for name in fetch_names]

    def prepared(self, program: Program | CompiledProgram,
                 fetch_list: Iterable[Variable | str] | None = None) -> Plan:
        """The plan ``run`` executes ``program`` as (fused ops, gradient buckets)."""
        program, strategy = _program_and_strategy(program)
        names = [f.name if isinstance(f, Variable) else str(f) for f in fetch_list or ()]
        return self._plan(program, strategy, names)

    def _plan(self, program: Program, strategy: BuildStrategy, fetch: list[str]) -> Plan:
        from .compiler import prepare

        plans = self._plans.setdefault(program, {})
        key = (program._version, strategy, frozenset(fetch))
        if key not in plans:
            for old in [k for k in plans if k[0] != program._version]:
                del plans[old]  # an older version's plans are dead
            plans[key] = prepare(program, strategy, keep=fetch)
        return plans[key]

    def owns(self, name: str, arr: np.ndarray) -> bool:
        """Whether ``arr`` is the array this executor made or adopted for ``name``."""
        return self._owned.get(name) is arr

    def adopt(self, name: str, arr: np.ndarray) -> None:
        """``arr`` becomes the array kernels may reuse and update in place for ``name``."""
        self._owned[name] = arr

    def flat_state(self, scope: Scope) -> dict:
        """The flat parameter and optimizer-state buffers the fused update steps of this
        executor laid out in ``scope`` (shared by every plan that runs there)."""
        return self._flat_state.setdefault(scope, {})

    def comm_stream(self, ring_id: int) -> CommStream:
        """The communication thread of ring ``ring_id`` (made on first use)."""
        from .compiler.comm_stream import CommStream

        if ring_id not in self._streams:
            self._streams[ring_id] = CommStream(f"ringflow-comm-ring{ring_id}")
        return self._streams[ring_id]

    def run_count(self, program: Program) -> int:
        """How many times this executor has run ``program``: random ops (dropout) draw
        from a generator seeded by it (``KernelContext.rng``)."""
        return self._run_counts.get(id(program), 0)

    def set_run_count(self, program: Program, count: int) -> None:
        """Restores the run count a checkpoint saved, so the random ops of the next run
        draw what an uninterrupted job's would."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ExecutionError(f"set_run_count: count must be an int >= 0, got {count!r}")
        self._run_counts[id(program)] = count

    def _run_steps(self, plan: Plan, scope: Scope) -> None:
        """The interpreter: for each step, its kernel reads inputs from and writes outputs
        to the scope. A kernel's own exception becomes an ExecutionError naming the op. No
        all-reduce of the run is still in flight when it returns, or raises."""
        try:
            self._interpret(plan.steps, scope)
        except BaseException:
            self._drain(plan, scope, quiet=True)
            raise
        self._drain(plan, scope)

    def _interpret(self, steps: list, scope: Scope) -> None:
        check_nan = os.environ.get("RINGFLOW_CHECK_NAN") == "1"
        profile = self.profile
        for pos, step in enumerate(steps):
            op = step.op
            ctx = KernelContext(self, op, step.index if step.index >= 0 else pos, scope)
            try:
                if profile:
                    t0 = time.perf_counter()
                    step.kernel(ctx)
                    self._record(op.type, time.perf_counter() - t0)
                else:
                    step.kernel(ctx)
            except RingflowError:
                raise
            except Exception as exc:
                raise ExecutionError(
                    f"op {ctx.index} ({op.type}) failed: {type(exc).__name__}: {exc}\n"
                    f"  {op_to_string(op)}") from exc
            if check_nan:
                _check_finite(ctx)

    def _drain(self, plan: Plan, scope: Scope, quiet: bool = False) -> None:
        """Wait for the plan's gradient buckets still in flight; ``quiet`` while another
        error is on its way (the first failure is the one to report)."""
        for bucket in plan.buckets:
            try:
                bucket.wait_scope(scope)
            except RingflowError:
                if not quiet:
                    raise

    def _record(self, op_type: str, seconds: float) -> None:
        entry = self._op_times.setdefault(op_type, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds

    def profile_stats(self) -> dict[str, tuple[int, float]]:
        """With profiling on: op type -> (kernel calls, total seconds in those kernels)."""
        return {k: (v[0], v[1]) for k, v in self._op_times.items()}

    def reset_profile(self) -> None:
        self._op_times.clear()

    @staticmethod
    def _feed(block, feed: Mapping[str, Any], scope: Scope) -> None:
        for name, value in feed.items():
            var = block._find_var_recursive(name)
            if var is None:
                raise ExecutionError(f"feed {name!r} is not a variable of the program")
            arr = np.asarray(value)
            if arr.dtype.name != var.dtype:
                if arr.dtype.kind == "O" or not np.can_cast(arr.dtype, var.dtype, "same_kind") \
                        or isinstance(value, np.ndarray):
                    raise ExecutionError(
                        f"feed {name!r}: expected dtype {var.dtype}, got {arr.dtype.name}")
                arr = arr.astype(var.dtype)
            if var.shape is not None and (
                    arr.ndim != len(var.shape)
                    or any(d != -1 and d != s for d, s in zip(var.shape, arr.shape))):
                raise ExecutionError(
                    f"feed {name!r}: expected shape {list(var.shape)} (-1 = any), "
                    f"got {list(arr.shape)}")
            scope[name] = arr

    @staticmethod
    def _apply_lr_scheduler(program: Program, scope: Scope) -> None:
        # A scheduler attached by an optimizer: its current value goes into the learning
        # rate variable before the run; ``run`` steps it after (Paddle users step it by hand).
        sched = program.lr_scheduler
        if sched is not None:
            name = getattr(sched, "var_name", None)
            if name is not None:
                dtype = program.global_block().var(name).dtype
                scope[name] = np.array([sched()], dtype=dtype)

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        self._owned.clear()
        self._flat_state = weakref.WeakKeyDictionary()
        self._plans = weakref.WeakKeyDictionary()


def _program_and_strategy(program: Any) -> tuple[Program, BuildStrategy]:
    from .compiler import CompiledProgram
    from .compiler.build_strategy import DEFAULT_BUILD_STRATEGY

    if program is None:
        return default_main_program(), DEFAULT_BUILD_STRATEGY
    if isinstance(program, CompiledProgram):
        return program.program, program.build_strategy
    return program, program.build_strategy or DEFAULT_BUILD_STRATEGY
