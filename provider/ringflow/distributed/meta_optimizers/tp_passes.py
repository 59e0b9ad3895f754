"""The tensor-parallel rewrite as short named passes (reference paddle-semantics.md 1.4, 4.5).

Each pass finds where it inserts by op role or by the op that writes a variable (an
anchor op) and inserts next to that op, never by integer offsets kept while the op list
changes. Startup passes: ``init_communicator`` (a ring and Paddle's sync triple),
``broadcast_params``. Main-program passes: ``insert_loss_grad_scale``,
``insert_grad_allreduce``, and ringflow's additions for model parallelism:
``insert_clip_norm_allreduce`` and ``mark_sharded_updates``, and for mixed precision:
``insert_found_inf_allreduce``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import ConfigError
from ...framework.program import Block, Operator
from ...framework.roles import (
    OP_ROLE_KEY,
    OP_ROLE_VAR_KEY,
    OpRole,
    is_backward_op,
    is_loss_grad_op,
    is_optimizer_op,
    is_update_op,
)
from ...ops.update_rules import RULES
from ...optimizer.clip import distributed_sq_ops


@dataclass(frozen=True)
class ProcessGroups:
    """This rank's place in the job: the world, its model-parallel group (a contiguous
    block of ``mp_degree`` ranks) and its data-parallel group (every ``mp_degree``-th rank
    from its mp rank; only when world > mp_degree)."""

    rank: int
    endpoints: tuple[str, ...]
    mp_degree: int

    @property
    def nranks(self) -> int:
        return len(self.endpoints)

    @property
    def mp_rank(self) -> int:
        return self.rank % self.mp_degree

    @property
    def mp_endpoints(self) -> list[str]:
        group = self.rank // self.mp_degree
        return [e for i, e in enumerate(self.endpoints) if i // self.mp_degree == group]

    @property
    def dp_degree(self) -> int:
        return self.nranks // self.mp_degree

    @property
    def dp_rank(self) -> int:
        return self.rank // self.mp_degree

    @property
    def dp_endpoints(self) -> list[str]:
        first = self.rank % self.mp_degree
        return [self.endpoints[first + i * self.mp_degree] for i in range(self.dp_degree)]


def check_degree(mp_degree, nranks: int) -> int:
    """The degree as an int >= 1 that divides the world size, else a ConfigError naming
    both numbers (the seed divides by it unchecked and asserts only after rewriting)."""
    if isinstance(mp_degree, bool) or not isinstance(mp_degree, int) or mp_degree < 1:
        raise ConfigError(f"tensor_parallel_degree must be an integer >= 1, got {mp_degree!r}"
                          f" (world size {nranks})")
    if nranks % mp_degree:
        raise ConfigError(f"tensor_parallel_degree={mp_degree} does not divide the world size "
                          f"{nranks} (PADDLE_TRAINERS_NUM)")
    return mp_degree


# startup program -----------------------------------------------------------------------------
def init_communicator(block: Block, endpoints: Sequence[str], rank: int, ring_id: int,
                      sync_ring_id: int) -> None:
    """Appends ring ``ring_id`` among ``endpoints`` (``c_comm_init``: ringflow's one op for
    Paddle's ``c_gen_nccl_id`` + ``c_comm_init``) and Paddle's "sync by all-reduce" triple on
    ``sync_ring_id``: fill_constant 1 (int32), c_allreduce_sum, c_sync_calc_stream."""
    forward = {OP_ROLE_KEY: int(OpRole.Forward)}
    block.append_op("c_comm_init", attrs={
        "ring_id": ring_id, "nranks": len(endpoints), "rank": rank,
        "endpoints": ",".join(endpoints), **forward})
    sync = block.create_var(name=block.program.unique_name("sync_var"), shape=[1],
                            dtype="int32", persistable=False, stop_gradient=True)
    block.append_op("fill_constant", outputs={"Out": [sync]},
                    attrs={"shape": [1], "dtype": "int32", "value": 1.0, "force_cpu": False,
                           **forward})
    block.append_op("c_allreduce_sum", inputs={"X": [sync]}, outputs={"Out": [sync]},
                    attrs={"ring_id": sync_ring_id, "use_calc_stream": True, **forward})
    block.append_op("c_sync_calc_stream", inputs={"X": [sync]}, outputs={"Out": [sync]},
                    attrs=forward)


def broadcast_params(block: Block, ring_id: int, skip_distributed: bool) -> None:
    """Appends a ``broadcast`` from ring rank 0 of every parameter of the startup block
    (``skip_distributed``: not the tensor-parallel shards, which differ by design), then one
    ``c_sync_comm_stream``. Nothing when no parameter is broadcast (the seed would still
    sync on the last parameter it skipped)."""
    forward = {OP_ROLE_KEY: int(OpRole.Forward)}
    last = None
    for param in block.iter_parameters():
        if skip_distributed and param.is_distributed:
            continue
        block.append_op("broadcast", inputs={"X": [param]}, outputs={"Out": [param]},
                        attrs={"ring_id": ring_id, "root": 0, "use_calc_stream": True,
                               **forward})
        last = param
    if last is not None:
        block.append_op("c_sync_comm_stream", inputs={"X": [last]}, outputs={"Out": [last]},
                        attrs={"ring_id": ring_id, **forward})


# main program --------------------------------------------------------------------------------
def insert_loss_grad_scale(block: Block, dp_degree: int,
                           scale_strategy: str = "avg") -> Operator | None:
    """Scales the loss gradient by 1/dp right after the last loss-grad op (in place), so
    the dp all-reduce SUM of gradients is their mean. Returns the scale op. Paddle's
    ``gradient_scale_configs["scale_strategy"]``: "avg" scales; "sum" (gradients summed over
    the ranks) and "customized" (the user scales the loss) insert nothing."""
    anchors = block.find_ops(is_loss_grad_op)
    if not anchors or scale_strategy != "avg":
        return None
    loss_grad = anchors[-1].output_arg_names[0]
    return block.insert_op_after(
        anchors[-1], "scale", inputs={"X": [loss_grad]}, outputs={"Out": [loss_grad]},
        attrs={"scale": 1.0 / dp_degree, "bias": 0.0, "bias_after_scale": True,
               OP_ROLE_KEY: int(OpRole.Backward)})


def _grad_writers(block: Block) -> list[tuple[Operator, list[tuple[str, str]]]]:
    """Backward ops carrying ``op_role_var`` (the last writer of each parameter gradient),
    with their (param, grad) pairs, in program order."""
    found = []
    for op in block.find_ops(is_backward_op):
        role_var = op.attr(OP_ROLE_VAR_KEY) or []
        if not role_var:
            continue
        if len(role_var) % 2:
            raise ConfigError(f"op {block.index_of(op)} ({op.type}): op_role_var "
                              f"{list(role_var)} is not a list of (param, grad) pairs")
        found.append((op, list(zip(role_var[::2], role_var[1::2]))))
    return found


def insert_grad_allreduce(block: Block, ring_id: int) -> list[Operator]:
    """After each op that last writes parameter gradients: ``c_sync_calc_stream`` then a
    ``c_allreduce_sum`` (in place, ring ``ring_id``) per gradient, a later pair of one op
    before an earlier one as in Paddle; one ``c_sync_comm_stream`` before the first
    optimizer op. Returns the all-reduce ops."""
    backward = {OP_ROLE_KEY: int(OpRole.Backward)}
    allreduces, dummy = [], None
    for op, pairs in reversed(_grad_writers(block)):
        first_grad = pairs[0][1]
        sync = block.insert_op_after(op, "c_sync_calc_stream", inputs={"X": [first_grad]},
                                     outputs={"Out": [first_grad]}, attrs=dict(backward))
        for _, grad in pairs:
            allreduces.append(block.insert_op_after(
                sync, "c_allreduce_sum", inputs={"X": [grad]}, outputs={"Out": [grad]},
                attrs={"ring_id": ring_id, "use_calc_stream": True, **backward}))
            dummy = grad
    first_update = next(iter(block.find_ops(is_optimizer_op)), None)
    if dummy is not None and first_update is not None:
        block.insert_op_before(first_update, "c_sync_comm_stream", inputs={"X": [dummy]},
                               outputs={"Out": [dummy]}, attrs={"ring_id": ring_id, **backward})
    return allreduces


def insert_clip_norm_allreduce(block: Block, ring_id: int) -> list[Operator]:
    """Global-norm clipping under model parallelism: the sum of squares of the sharded
    gradients is all-reduced over the mp ring right after the op that writes it, so the
    norm is that of the whole model; replicated gradients are counted once (ringflow's
    addition; see ``optimizer.clip``)."""
    inserted = []
    for _, op in distributed_sq_ops(block):
        partial = op.output_arg_names[0]
        inserted.append(block.insert_op_after(
            op, "c_allreduce_sum", inputs={"X": [partial]}, outputs={"Out": [partial]},
            attrs={"ring_id": ring_id, "use_calc_stream": True,
                   OP_ROLE_KEY: int(op.attr(OP_ROLE_KEY) or OpRole.Optimize)}))
    return inserted


def insert_found_inf_allreduce(block: Block, ring_ids: Sequence[int]) -> list[Operator]:
    """Mixed precision: the FoundInfinite flag of each ``check_finite_and_unscale`` becomes
    the max over ``ring_ids`` (cast to int32, ``c_allreduce_max`` per ring, cast back, as
    Paddle's sharding does), so every rank skips the same steps and keeps one loss scale:
    a sharded gradient overflows on one model-parallel rank only (ringflow's addition; Paddle's
    tensor-parallel optimizer leaves the flag per rank)."""
    inserted: list[Operator] = []
    if not ring_ids:
        return inserted
    optimize = {OP_ROLE_KEY: int(OpRole.Optimize)}
    for check in block.find_ops(type="check_finite_and_unscale"):
        found = check.output("FoundInfinite")[0]
        as_int = block.create_var(name=f"{found}@cast_int32", shape=[1], dtype="int32",
                                  stop_gradient=True)
        anchor = block.insert_op_after(check, "cast", inputs={"X": [found]},
                                       outputs={"Out": [as_int]},
                                       attrs={"in_dtype": "bool", "out_dtype": "int32",
                                              **optimize})
        inserted.append(anchor)
        for ring_id in ring_ids:
            anchor = block.insert_op_after(anchor, "c_allreduce_max", inputs={"X": [as_int]},
                                           outputs={"Out": [as_int]},
                                           attrs={"ring_id": ring_id, "use_calc_stream": True,
                                                  **optimize})
            inserted.append(anchor)
        inserted.append(block.insert_op_after(anchor, "cast", inputs={"X": [as_int]},
                                              outputs={"Out": [found]},
                                              attrs={"in_dtype": "int32", "out_dtype": "bool",
                                                     **optimize}))
    return inserted


def mark_sharded_updates(block: Block, ring_id: int) -> list[Operator]:
    """Lamb and LARS scale a parameter's step by norms of the whole parameter: their update
    ops of sharded parameters get ``ring_id``, over which the kernel all-reduces its partial
    sums of squares (ringflow's addition; Paddle uses the shard's norms)."""
    marked = []
    for op in block.find_ops(is_update_op):
        rule = RULES.get(op.type)
        if rule is None or not rule.whole_norms:
            continue
        param = block._find_var_recursive(op.input("Param")[0])
        if getattr(param, "is_distributed", False):
            op._set_attr("ring_id", ring_id)
            marked.append(op)
    return marked


def check_partitions(block: Block, mp_degree: int) -> None:
    """Every model-parallel layer of the program was built for ``mp_degree`` partitions:
    ring-0 ops' ``nranks`` and sharded parameters' part counts, else a ConfigError naming
    both numbers (a layer built for 2 in a degree-1 job silently computes a wrong model)."""
    for i, op in enumerate(block.ops):
        if op.has_attr("nranks") and op.attr("ring_id") == 0 and op.type != "c_comm_init" \
                and int(op.attr("nranks")) != mp_degree:
            raise ConfigError(f"op {i} ({op.type}) was built with num_partitions="
                              f"{op.attr('nranks')}, but the strategy's tensor_parallel_degree"
                              f" is {mp_degree}")
    for param in block.iter_parameters():
        shard = getattr(param, "shard", None)
        parts = shard.parts if shard is not None else 1
        if param.is_distributed and parts != mp_degree:
            raise ConfigError(f"parameter {param.name!r} is split into {parts} partitions, "
                              f"but the strategy's tensor_parallel_degree is {mp_degree}")
