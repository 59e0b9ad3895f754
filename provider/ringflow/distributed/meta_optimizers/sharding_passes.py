"""The sharding rewrite as named passes (Paddle's sharding_optimizer.py and its helpers, in
ringflow's small-pass form). Each rank of a sharding group owns whole parameters
(``shard_layout``); after the inner optimizer has built the backward and update ops:

``insert_grad_reduce``      a ``c_reduce_sum`` of every gradient to its owner, right after
                            the op that last writes it, and a ``c_sync_comm_stream`` before
                            the optimizer section (Paddle: ``insert_reduce_ops``)
``prune_other_shards``      the optimizer section keeps only this rank's parameters: their
                            per-parameter ops (decay, clip terms, update), the other ranks'
                            gradients dropped from list ops (AMP's checks, the clip's sums,
                            the skip-update state), the other ranks' optimizer state gone
                            from both programs (Paddle: ``_prune_main_program`` /
                            ``_prune_startup_program``)
``insert_clip_sum_allreduce`` the clip's partial sums of squares all-reduced over the group,
                            so the global norm counts every shard once
``insert_param_broadcast``  each parameter broadcast from its owner after the update
                            (Paddle: ``insert_broadcast_ops``)
"""

from __future__ import annotations

from collections.abc import Sequence

from ...framework.program import Block, Operator
from ...framework.registry import get_op_def
from ...framework.roles import OP_ROLE_KEY, OP_ROLE_VAR_KEY, OpRole, is_optimizer_op
from ...ops.update_rules import RULES
from ...optimizer.clip import DIST_SQ_PREFIX, REPL_SQ_PREFIX
from .tp_passes import _grad_writers


def reduced_grads(block: Block) -> list[tuple[Operator, str, str]]:
    """(last writer, param, grad) of every gradient in the order ``insert_grad_reduce``
    reduces them: writers in program order, a writer's pairs in their order."""
    return [(op, p, g) for op, pairs in _grad_writers(block) for p, g in pairs]


def insert_grad_reduce(block: Block, ring_id: int, owner: dict[str, int],
                       stage: int) -> list[Operator]:
    """After each writer: ``c_sync_calc_stream``, then ``c_reduce_sum`` of each of its
    gradients to the owner of its parameter (``owner``: param name -> group rank);
    ``c_sync_comm_stream`` before the first optimizer op. Returns the reduce ops."""
    backward = {OP_ROLE_KEY: int(OpRole.Backward)}
    reduces: list[Operator] = []
    last = None
    for op, pairs in _grad_writers(block):
        anchor = block.insert_op_after(op, "c_sync_calc_stream", inputs={"X": [pairs[0][1]]},
                                       outputs={"Out": [pairs[0][1]]}, attrs=dict(backward))
        for param, grad in pairs:
            anchor = block.insert_op_after(
                anchor, "c_reduce_sum", inputs={"X": [grad]}, outputs={"Out": [grad]},
                attrs={"ring_id": ring_id, "root_id": owner[param], "use_calc_stream": True,
                       "sharding_stage": stage, **backward})
            reduces.append(anchor)
            last = grad
    first_update = next(iter(block.find_ops(is_optimizer_op)), None)
    if last is not None and first_update is not None:
        block.insert_op_before(first_update, "c_sync_comm_stream", inputs={"X": [last]},
                               outputs={"Out": [last]}, attrs={"ring_id": ring_id, **backward})
    return reduces


def prune_other_shards(main: Block, startup: Block, others: set[str],
                       other_grads: set[str]) -> list[str]:
    """Removes from the optimizer section what only parameters of other ranks need:
    ``others`` are their names, ``other_grads`` their gradients as reduced (float16 ones
    under AMP) and as the optimizer reads them. Returns the optimizer-state variables
    removed from both programs."""
    gone = set(others) | set(other_grads) | {
        n for op in main.ops if op.type in RULES and op.input("Param")[0] in others
        for n in _state_of(op)}
    removed_updates: list[Operator] = []
    for op in list(main.ops):
        if not is_optimizer_op(op):
            continue
        if _for_others(op, others) or _reads_only_gone(op, gone):
            gone.update(op.output_arg_names)
            if op.type in RULES:
                removed_updates.append(op)
            main._remove_op(main.index_of(op))
        else:
            gone.update(_drop_gone_from_lists(main, op, gone))
    return _remove_state(main, startup, removed_updates)


def _state_of(update: Operator) -> list[str]:
    """The optimizer-state variables an update op reads (its rule's state slots)."""
    return [n for slot in RULES[update.type].state_slots for n in update.input(slot)]


def _for_others(op: Operator, others: set[str]) -> bool:
    role_var = op.attr(OP_ROLE_VAR_KEY) or []
    return bool(role_var) and all(p in others for p in role_var[::2])


def _reads_only_gone(op: Operator, gone: set[str]) -> bool:
    """A one-variable-per-slot op (AMP's moved cast) whose every input is gone."""
    names = op.input_arg_names
    return bool(names) and all(len(v) <= 1 for v in op.inputs.values()) \
        and all(n in gone for n in names)


def _drop_gone_from_lists(block: Block, op: Operator, gone: set[str]) -> set[str]:
    """Takes gone variables out of ``op``'s list slots, with the output that pairs with
    each (Out_i of X_i, Saved_i of X_i): AMP's checks, skip-update lists, the clip's sums.
    A sum left with nothing to add becomes a constant 0. Returns the outputs dropped."""
    changed, dropped = False, set()
    opdef = get_op_def(op.type)
    for slot, names in list(op.inputs.items()):
        if not opdef.input_slot(slot).duplicable:
            continue
        keep = [i for i, n in enumerate(names) if n not in gone]
        if len(keep) == len(names):
            continue
        changed = True
        op._set_input(slot, [names[i] for i in keep])
        for out_slot, outs in list(op.outputs.items()):
            if opdef.output_slot(out_slot).duplicable and len(outs) == len(names):
                op._set_output(out_slot, [outs[i] for i in keep])
                dropped.update(o for i, o in enumerate(outs) if i not in keep)
    if changed and op.type == "sum" and not op.inputs["X"]:
        out = op.output("Out")[0]
        var = block.var(out)
        at = block.index_of(op)
        block._remove_op(at)
        block._insert_op(at, "fill_constant", outputs={"Out": [out]},
                         attrs={"shape": [1], "dtype": var.dtype, "value": 0.0,
                                OP_ROLE_KEY: int(op.attr(OP_ROLE_KEY) or OpRole.Optimize)})
    elif changed:
        block.program._bump()
    return dropped


def _remove_state(main: Block, startup: Block, updates: Sequence[Operator]) -> list[str]:
    """The persistable state of removed update ops that nothing else reads, out of the main
    program (variables) and the startup program (their initialising ops and variables)."""
    state = {n for op in updates for n in _state_of(op)}
    read = {n for op in main.ops for n in op.input_arg_names}
    removed = sorted(n for n in state if n not in read and main.has_var(n)
                     and main.var(n).persistable)
    for name in removed:
        main._remove_var(name)
        for op in startup.find_ops(output=name):
            startup._remove_op(startup.index_of(op))
        if startup.has_var(name):
            startup._remove_var(name)
    return removed


def insert_clip_sum_allreduce(block: Block, ring_id: int) -> list[Operator]:
    """Global-norm clipping over shards: each rank summed the squares of its own
    parameters' gradients, so both partial sums are all-reduced over the group."""
    inserted = []
    for op in list(block.ops):
        outs = op.output_arg_names
        # the op that makes a partial sum (an all-reduce after it writes it again)
        if op.type in ("sum", "fill_constant") and any(
                n.startswith((DIST_SQ_PREFIX, REPL_SQ_PREFIX)) for n in outs):
            partial = outs[0]
            inserted.append(block.insert_op_after(
                op, "c_allreduce_sum", inputs={"X": [partial]}, outputs={"Out": [partial]},
                attrs={"ring_id": ring_id, "use_calc_stream": True,
                       OP_ROLE_KEY: int(OpRole.Optimize)}))
    return inserted


def insert_param_broadcast(block: Block, ring_id: int, params: Sequence[str],
                           owner: dict[str, int]) -> list[Operator]:
    """At the end of the step, each parameter in ``params`` order broadcast from its
    owner over the group, then one ``c_sync_comm_stream``."""
    optimize = {OP_ROLE_KEY: int(OpRole.Optimize)}
    made = [block.append_op("broadcast", inputs={"X": [p]}, outputs={"Out": [p]},
                            attrs={"ring_id": ring_id, "root": owner[p],
                                   "use_calc_stream": True, **optimize})
            for p in params]
    if made:
        block.append_op("c_sync_comm_stream", inputs={"X": [params[-1]]},
                        outputs={"Out": [params[-1]]}, attrs={"ring_id": ring_id, **optimize})
    return made
