"""append_backward(..., checkpoints=...): the segments between checkpoints are recomputed
in the backward pass (copies with role Backward, named ``<var>.subprog_<k>`` before they
share buffers), the gradients are bitwise those of the plain backward (dropout draws the
same mask in its copy), and the executor holds fewer bytes."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ConfigError
from ringflow.framework.roles import OP_ROLE_KEY, OpRole
from ringflow.models import mlp, transformer

SEED = 3


def build(kind: str, checkpoints: bool, dropout: float = 0.0):
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = SEED
    with rf.program_guard(main, startup):
        if kind == "mlp":
            model = mlp(input_size=16, hidden_size=64, num_classes=8, num_layers=4,
                        dtype="float64", dropout=dropout)
        else:
            model = transformer(vocab_size=32, seq_len=16, hidden_size=32, num_heads=4,
                                num_layers=3, dtype="float64", dropout=dropout)
        params_grads = rf.append_backward(
            model.loss, checkpoints=model.checkpoints if checkpoints else None)
    rf.verify(main)
    return main, startup, model, params_grads


def live_bytes(exe: rf.Executor, scope: rf.Scope) -> int:
    """Bytes of every distinct array the scope and the executor's buffers hold."""
    seen, total = set(), 0
    for arr in [*scope._vars.values(), *exe._owned.values()]:
        while isinstance(arr.base, np.ndarray):
            arr = arr.base
        if id(arr) not in seen:
            seen.add(id(arr))
            total += arr.nbytes
    return total


def train(kind: str, checkpoints: bool, dropout: float = 0.0, steps: int = 2):
    """Per step: the loss and every parameter gradient; and the live bytes at the end."""
    main, startup, model, params_grads = build(kind, checkpoints, dropout)
    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    fetched = []
    for step in range(steps):
        fetched.append(exe.run(main, feed=model.make_batch(SEED, step, 32),
                               fetch_list=[model.loss, *(g for _, g in params_grads)],
                               scope=scope))
    return fetched, live_bytes(exe, scope)


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_recomputed_gradients_are_bitwise_those_of_the_plain_backward(kind, dropout):
    plain, _ = train(kind, False, dropout)
    recomputed, _ = train(kind, True, dropout)
    for step_plain, step_rc in zip(plain, recomputed):
        assert len(step_plain) == len(step_rc)
        for a, b in zip(step_plain, step_rc):
            np.testing.assert_array_equal(a, b)


def test_recompute_holds_fewer_live_bytes_for_the_transformer():
    _, plain = train("transformer", False)
    _, recomputed = train("transformer", True)
    assert recomputed < 0.85 * plain


def _copy_ops(main):
    """Backward ops that are forward op types: the recomputed copies."""
    forward_types = {op.type for op in main.global_block().ops
                     if int(op.attr(OP_ROLE_KEY)) == OpRole.Forward}
    return [op for op in main.global_block().ops
            if int(op.attr(OP_ROLE_KEY)) == OpRole.Backward and op.type in forward_types
            and not op.type.endswith("_grad")]


def test_each_segment_but_the_tail_is_recomputed_with_role_backward():
    main, *_ = build("mlp", True)
    copies = _copy_ops(main)
    # 3 checkpoints -> 3 segments; each copies fc1, +bias, relu, fc2 (fc2's bias add is not
    # needed: its gradient reads only shapes and the checkpoint itself)
    assert [op.type for op in copies] == ["matmul_v2", "elementwise_add", "relu",
                                          "matmul_v2"] * 3
    assert all(not op.attr("op_role_var") for op in copies)
    plain, _, _, _ = build("mlp", False)
    assert _copy_ops(plain) == []


def test_segments_share_buffers_and_checkpoints_keep_their_names():
    main, _, model, _ = build("mlp", True)
    block = main.global_block()
    shared = sorted(n for n in block.vars if n.startswith("recompute_buf"))
    assert len(shared) == 5          # one segment's fc1, +bias, relu, fc2, +bias
    for name in model.checkpoints:
        writers = [op.type for op in block.ops if name in op.output_arg_names]
        assert writers == ["relu"], name   # written once, by the forward


def test_a_random_op_without_a_seed_gets_its_position_as_seed():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 4], "float64")
        h = rf.nn.fc(x, 4)
        block = main.global_block()
        drop = block.append_op("dropout", inputs={"X": [h]},
                               outputs={"Out": ["d"], "Mask": ["m"]},
                               attrs={"dropout_prob": 0.5})
        ckpt = rf.nn.relu(block.var("d"))
        loss = rf.nn.mean(rf.nn.fc(ckpt, 1))
        rf.append_backward(loss, checkpoints=[ckpt])
    index = 2   # matmul_v2, elementwise_add, dropout
    assert drop.attr("seed") == 1 << 32 | index
    copies = [op for op in block.ops if op.type == "dropout" and op is not drop]
    assert [op.attr("seed") for op in copies] == [1 << 32 | index]


@pytest.mark.parametrize("checkpoints, message", [
    (["no_such_var"], "checkpoint 'no_such_var' is not a variable"),
    (["x"], "checkpoint 'x' is not computed by a forward op"),
])
def test_a_bad_checkpoint_is_a_config_error_naming_it(checkpoints, message):
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 4], "float32")
        loss = rf.nn.mean(rf.nn.fc(x, 2))
        with pytest.raises(ConfigError, match=message):
            rf.append_backward(loss, checkpoints=checkpoints)
