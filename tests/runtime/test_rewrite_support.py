"""What rewrite passes stand on: ops found by predicate and inserted next to an anchor op,
a variable renamed in one op, and create_var refusing to redeclare a variable."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.errors import ProgramError
from ringflow.framework import OpRole, is_backward_op, is_loss_grad_op


def _trained_program():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 4])
        y = rf.data("y", [-1], "int64")
        h = rf.nn.fc(x, 8, activation="relu", weight_attr="w1")
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(h, 3, weight_attr="w2"),
                                                           y))
        rf.optimizer.SGD(0.1).minimize(loss)
    return main, loss


def test_find_ops_filters_by_predicate_type_output_and_input_in_program_order():
    main, _ = _trained_program()
    block = main.global_block()
    assert [op.type for op in block.find_ops(is_loss_grad_op)] == ["fill_constant"]
    assert [op.type for op in block.find_ops(type="sgd")] == ["sgd"] * 4
    writers = block.find_ops(output="w1@GRAD")
    assert [op.type for op in writers] == ["matmul_v2_grad"]
    readers = block.find_ops(is_backward_op, input="w2")
    assert [op.type for op in readers] == ["matmul_v2_grad"]
    assert block.find_ops(type="sgd", input="w1")[0].input("Param") == ["w1"]


def test_insert_before_and_after_an_anchor_lands_next_to_it():
    main, loss = _trained_program()
    block = main.global_block()
    anchor = block.find_ops(is_loss_grad_op)[0]
    grad = anchor.output_arg_names[0]
    after = block.insert_op_after(anchor, "scale", inputs={"X": [grad]},
                                  outputs={"Out": [grad]}, attrs={"scale": 0.5})
    before = block.insert_op_before(anchor, "scale", inputs={"X": [loss.name]},
                                    outputs={"Out": [loss.name]}, attrs={"scale": 1.0})
    i = block.index_of(anchor)
    assert block.ops[i - 1] is before and block.ops[i + 1] is after
    assert after.attr("op_role") == OpRole.Forward  # roles are the caller's to give


def test_index_of_an_op_of_another_block_is_an_error():
    main, _ = _trained_program()
    other, _ = _trained_program()
    with pytest.raises(ProgramError, match="is not in block 0"):
        main.global_block().index_of(other.global_block().ops[0])


def test_rename_var_in_one_op_changes_that_op_only():
    main, _ = _trained_program()
    block = main.global_block()
    block.create_var(name="w1_copy", shape=[4, 8], dtype="float32")
    first, *rest = block.find_ops(input="w1")
    block.rename_var_in_op(first, "w1", "w1_copy")
    assert "w1_copy" in first.input_arg_names and "w1" not in first.input_arg_names
    assert all("w1" in op.input_arg_names for op in rest)


def test_rename_to_an_unknown_variable_is_an_error_naming_it():
    main, _ = _trained_program()
    block = main.global_block()
    with pytest.raises(ProgramError, match="'nowhere' is not a variable of block 0"):
        block.rename_var_in_op(block.ops[0], "x", "nowhere")


def test_create_var_returns_the_existing_variable_when_it_agrees():
    block = rf.Program().global_block()
    v = block.create_var(name="v", shape=[2, 3], dtype="float32")
    assert block.create_var(name="v", shape=[2, 3], dtype="float32") is v
    assert block.create_var(name="v") is v


@pytest.mark.parametrize("kwargs, asked", [
    ({"shape": [3, 2]}, "float32[3, 2]"),
    ({"dtype": "float64"}, "float64[2, 3]"),
])
def test_create_var_with_another_shape_or_dtype_names_both(kwargs, asked):
    block = rf.Program().global_block()
    block.create_var(name="v", shape=[2, 3], dtype="float32")
    with pytest.raises(ProgramError) as err:
        block.create_var(name="v", **kwargs)
    assert str(err.value) == (f"create_var: variable 'v' exists as float32[2, 3]; cannot "
                              f"declare it again as {asked}")
