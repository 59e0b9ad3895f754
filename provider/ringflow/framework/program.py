"""The static program IR: Program -> Block -> (Variable, Operator), as PaddlePaddle's;
the default programs and ``program_guard``.

The records (records.py) are plain data; only ``Block`` mutates its op list. An op is
checked against the op table (``registry``) when it is built: unknown type, unknown slot or
missing input fail right there; ``verify`` explains whole programs.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import ProgramError, RingflowError
from .printer import program_to_string
from .records import Operator, Parameter, Variable, _names
from .registry import EMPTY_VAR_NAME, ShapeContext, convert_dtype, get_op_def, slot_errors
from .roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole

__all__ = [
    "Block", "Operator", "Parameter", "Program", "Variable", "default_main_program",
    "default_startup_program", "program_guard", "switch_main_program",
]


class Block:
    def __init__(self, program: Program, idx: int, parent_idx: int = -1) -> None:
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.vars: dict[str, Variable] = {}
        self.ops: list[Operator] = []

    # variables -----------------------------------------------------------------------------
    def var(self, name: str) -> Variable:
        v = self._find_var_recursive(name)
        if v is None:
            raise ProgramError(f"variable {name!r} is not in block {self.idx}")
        return v

    def has_var(self, name: str) -> bool:
        return name in self.vars

    def _find_var_recursive(self, name: str) -> Variable | None:
        block: Block | None = self
        while block is not None:
            if name in block.vars:
                return block.vars[name]
            block = block.parent
        return None

    @property
    def parent(self) -> Block | None:
        return self.program.blocks[self.parent_idx] if self.parent_idx >= 0 else None

    def create_var(self, name: str | None = None, **kwargs: Any) -> Variable:
        """A new variable, or the existing one of that name when the shape and dtype given
        (if any) agree with it; a disagreement is a ProgramError naming both."""
        name = name or self.program.unique_name("tmp")
        if name in self.vars:
            existing = self.vars[name]
            _check_redeclaration(existing, kwargs)
            return existing
        v = Variable(self, name, **kwargs)
        self.vars[name] = v
        return v

    def create_parameter(self, name: str, shape: Iterable[int], dtype: Any = "float32",
                         **kwargs: Any) -> Parameter:
        if name in self.vars and not isinstance(self.vars[name], Parameter):
            raise ProgramError(f"cannot create parameter {name!r}: a variable of that name exists")
        p = Parameter(self, name, shape, dtype, **kwargs)
        self.vars[name] = p
        return p

    def _remove_var(self, name: str) -> None:
        self.vars.pop(name, None)

    def iter_parameters(self) -> Iterator[Parameter]:
        return (v for v in self.vars.values() if isinstance(v, Parameter))

    def all_parameters(self) -> list[Parameter]:
        return list(self.iter_parameters())

    # ops -----------------------------------------------------------------------------------
    def append_op(self, type: str, inputs: dict | None = None, outputs: dict | None = None,
                  attrs: dict | None = None) -> Operator:
        op = self._make_op(type, inputs, outputs, attrs, len(self.ops))
        self.ops.append(op)
        self.program._bump()
        return op

    def _insert_op(self, index: int, type: str, inputs: dict | None = None,
                   outputs: dict | None = None, attrs: dict | None = None) -> Operator:
        at = min(index if index >= 0 else max(len(self.ops) + index, 0), len(self.ops))
        op = self._make_op(type, inputs, outputs, attrs, at)
        self.ops.insert(index, op)
        self.program._bump()
        return op

    def _prepend_op(self, type: str, inputs: dict | None = None, outputs: dict | None = None,
                    attrs: dict | None = None) -> Operator:
        return self._insert_op(0, type, inputs, outputs, attrs)

    def _remove_op(self, index: int) -> None:
        del self.ops[index]
        self.program._bump()

    # what rewrite passes use: ops found by predicate, inserted next to an anchor op ----------
    def index_of(self, op: Operator) -> int:
        """The position of ``op`` (by identity) in this block."""
        for i, candidate in enumerate(self.ops):
            if candidate is op:
                return i
        raise ProgramError(f"op {op.type!r} is not in block {self.idx}")

    def find_ops(self, pred: Callable[[Operator], Any] | None = None, *,
                 type: str | None = None, output: str | None = None,
                 input: str | None = None) -> list[Operator]:
        """The ops, in program order, that satisfy ``pred`` and have the given type, write
        variable ``output`` and read variable ``input`` (each criterion optional)."""
        return [op for op in self.ops
                if (type is None or op.type == type)
                and (output is None or output in op.output_arg_names)
                and (input is None or input in op.input_arg_names)
                and (pred is None or pred(op))]

    def insert_op_before(self, anchor: Operator, type: str, inputs: dict | None = None,
                         outputs: dict | None = None, attrs: dict | None = None) -> Operator:
        return self._insert_op(self.index_of(anchor), type, inputs, outputs, attrs)

    def insert_op_after(self, anchor: Operator, type: str, inputs: dict | None = None,
                        outputs: dict | None = None, attrs: dict | None = None) -> Operator:
        return self._insert_op(self.index_of(anchor) + 1, type, inputs, outputs, attrs)

    def rename_var_in_op(self, op: Operator, old: str, new: str) -> None:
        """Reads and writes of ``old`` in ``op`` refer to ``new`` (which must exist)."""
        if self._find_var_recursive(new) is None:
            raise ProgramError(f"cannot rename {old!r} to {new!r} in op {op.type!r}: "
                               f"{new!r} is not a variable of block {self.idx}")
        op._rename_input(old, new)
        op._rename_output(old, new)
        self.program._bump()

    def _make_op(self, type: str, inputs: dict | None, outputs: dict | None,
                 attrs: dict | None, index: int) -> Operator:
        """The op, checked against its definition and with its output variables made or
        given their inferred shapes; ``index`` is where it will go (for error messages)."""
        opdef = get_op_def(type)
        ins = {slot: _names(v) for slot, v in (inputs or {}).items()}
        outs = {slot: _names(v) for slot, v in (outputs or {}).items()}
        where = f"building op {type!r} (would be op {index} of block {self.idx})"
        errors = slot_errors(opdef, ins, outs)
        if errors:
            raise ProgramError(f"{where}: {errors[0]}")
        for names in ins.values():
            for n in names:
                if n != EMPTY_VAR_NAME and self._find_var_recursive(n) is None:
                    raise ProgramError(f"{where}: input variable {n!r} is not defined")
        full_attrs = dict(opdef.attrs)
        full_attrs.update(attrs or {})
        full_attrs.setdefault(OP_ROLE_KEY, int(self.program._current_role))
        if self.program._current_role_var and OP_ROLE_VAR_KEY not in (attrs or {}):
            full_attrs[OP_ROLE_VAR_KEY] = list(self.program._current_role_var)
        op = Operator(self, type, ins, outs, full_attrs)
        self._infer_output_vars(op, opdef, where)
        return op

    def _infer_output_vars(self, op: Operator, opdef, where: str) -> None:
        """Create missing output vars and fill in shapes that are still unknown."""
        for names in op.outputs.values():
            for n in names:
                if n != EMPTY_VAR_NAME and self._find_var_recursive(n) is None:
                    self.create_var(n)
        if opdef.infer_shape is None:
            return
        ctx = ShapeContext(op, self)
        try:
            opdef.infer_shape(ctx)
        except RingflowError as exc:
            # the op's own explanation ("op 'matmul_v2': contracted dims differ ..."), placed
            message = str(exc).removeprefix(f"op {op.type!r}: ")
            raise ProgramError(f"{where}: {message}\n  {op!r}") from exc
        except Exception as exc:
            raise ProgramError(f"{where}: shape inference failed: {exc}\n  {op!r}") from exc
        for slot, metas in ctx.results.items():
            for name, meta in zip(op.outputs.get(slot, []), metas):
                v = self._find_var_recursive(name) if name != EMPTY_VAR_NAME else None
                if v is not None and meta is not None and v.shape is None:
                    v.shape, v.dtype = meta


class Program:
    """A static program: block 0 is the global block. ``random_seed`` seeds initializers
    and random ops, so two builds with the same seed give bitwise-identical values."""

    def __init__(self) -> None:
        self.blocks: list[Block] = [Block(self, 0)]
        self.random_seed = 0
        self.lr_scheduler = None  # set by an optimizer whose learning rate is a scheduler
        # runs of this program per training step: the scheduler steps after the last of
        # them (fleet's gradient_merge: k micro-steps, one update)
        self.runs_per_step = 1
        # the BuildStrategy the executor runs a plain Program with (None: the default);
        # fleet sets it from DistributedStrategy's build_strategy and fusion options
        self.build_strategy = None
        self._version = 0
        self._name_counter = itertools.count()
        self._current_role = OpRole.Forward
        self._current_role_var: list[str] = []
        self._is_test = False

    def global_block(self) -> Block:
        return self.blocks[0]

    def current_block(self) -> Block:
        return self.blocks[-1]

    def block(self, idx: int) -> Block:
        return self.blocks[idx]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def all_parameters(self) -> list[Parameter]:
        return [p for b in self.blocks for p in b.iter_parameters()]

    def list_vars(self) -> Iterator[Variable]:
        for b in self.blocks:
            yield from b.vars.values()

    def unique_name(self, prefix: str) -> str:
        taken = self.global_block().vars
        while True:
            name = f"{prefix}_{next(self._name_counter)}"
            if name not in taken:
                return name

    def _bump(self) -> None:
        self._version += 1

    @contextlib.contextmanager
    def _role_guard(self, role: int, role_var: Iterable[str] = ()) -> Iterator[None]:
        """Ops appended inside get ``op_role`` = role (and ``op_role_var`` if given)."""
        saved = self._current_role, self._current_role_var
        self._current_role, self._current_role_var = role, list(role_var)
        try:
            yield
        finally:
            self._current_role, self._current_role_var = saved

    def _backward_role_guard(self):
        return self._role_guard(OpRole.Backward)

    def _optimized_guard(self, param_and_grad: Iterable[Any] = ()):
        return self._role_guard(OpRole.Optimize, _names(list(param_and_grad)))

    def _lr_schedule_guard(self):
        return self._role_guard(OpRole.LRSched)

    def clone(self, for_test: bool = False) -> Program:
        """A deep copy. ``for_test``, as Paddle's ``clone(for_test=True)``, keeps only the
        forward ops, sets ``is_test`` on ops that have it (dropout becomes the identity),
        drops the variables no kept op uses (gradients, optimizer state; parameters and data
        stay) and carries no learning-rate scheduler: running it never steps one."""
        p = Program.__new__(Program)
        memo = {id(self): p}
        p.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()
                           if k not in ("blocks", "lr_scheduler", "_name_counter")})
        p.lr_scheduler = None if for_test else self.lr_scheduler
        # Both go on counting from here, so a name made later in one is not made in the other.
        start = next(self._name_counter)
        p._name_counter = itertools.count(start)
        self._name_counter = itertools.count(start)
        p.blocks = [_clone_block(b, p, for_test) for b in self.blocks]
        if for_test:
            _drop_unused_vars(p)
        p._is_test = for_test
        p._version = 0
        return p

    def __str__(self) -> str:

        return program_to_string(self)

    def to_string(self, throw_on_error: bool = False, with_details: bool = False) -> str:
        return str(self)


_NOT_FOR_TEST = OpRole.Backward | OpRole.Optimize | OpRole.LRSched


def _clone_block(block: Block, program: Program, for_test: bool) -> Block:
    nb = Block(program, block.idx, block.parent_idx)
    for name, v in block.vars.items():
        nv = copy.copy(v)
        nv.block = nb
        if isinstance(v, Parameter):
            nv.optimize_attr = dict(v.optimize_attr)
        nb.vars[name] = nv
    for op in block.ops:
        if for_test and int(op.attr(OP_ROLE_KEY) or 0) & _NOT_FOR_TEST:
            continue
        nop = Operator(nb, op.type, copy.deepcopy(op.inputs), copy.deepcopy(op.outputs),
                       copy.deepcopy(op.attrs))
        if for_test and "is_test" in get_op_def(op.type).attrs:
            nop.attrs["is_test"] = True
        nb.ops.append(nop)
    return nb


def _check_redeclaration(existing: Variable, kwargs: dict[str, Any]) -> None:
    shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
    same_shape = shape is None or existing.shape is None or \
        tuple(int(d) for d in shape) == existing.shape
    same_dtype = dtype is None or convert_dtype(dtype) == existing.dtype
    if not (same_shape and same_dtype):
        asked = f"{convert_dtype(dtype) if dtype is not None else existing.dtype}" \
                f"{list(shape) if shape is not None else list(existing.shape or [])}"
        raise ProgramError(f"create_var: variable {existing.name!r} exists as "
                           f"{existing.dtype}{list(existing.shape or [])}; cannot declare it "
                           f"again as {asked}")


def _drop_unused_vars(program: Program) -> None:
    used = {n for b in program.blocks for op in b.ops
            for n in (*op.input_arg_names, *op.output_arg_names)}
    for b in program.blocks:
        for name in [n for n, v in b.vars.items()
                     if n not in used and not (v.is_data or isinstance(v, Parameter))]:
            del b.vars[name]


# default programs and the guard -------------------------------------------------------------
_main_program = Program()
_startup_program = Program()


def default_main_program() -> Program:
    return _main_program


def default_startup_program() -> Program:
    return _startup_program


@contextlib.contextmanager
def program_guard(main_program: Program, startup_program: Program | None = None):
    """Inside, layers append to ``main_program`` and initializers to ``startup_program``."""
    global _main_program, _startup_program
    if not isinstance(main_program, Program):
        raise ProgramError(f"program_guard expects a Program, got {type(main_program).__name__}")
    saved = _main_program, _startup_program
    _main_program = main_program
    if startup_program is not None:
        _startup_program = startup_program
    try:
        yield
    finally:
        _main_program, _startup_program = saved


def switch_main_program(program: Program) -> Program:
    global _main_program
    prev, _main_program = _main_program, program
    return prev
