"""The program IR: building ops, roles, guards, cloning, printing."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.errors import ProgramError
from ringflow.framework import (
    OpRole,
    is_backward_op,
    is_loss_grad_op,
    is_optimizer_op,
    is_update_op,
)
from ringflow.framework.printer import role_name
from ringflow.framework.program import Parameter


def _chain(block):
    """x (data) -> rft_scale(2) -> h -> rft_add(h, w) -> out."""
    x = block.create_var(name="x", shape=[-1, 3], dtype="float32", is_data=True,
                         stop_gradient=True)
    w = block.create_parameter("w", shape=[1, 3], dtype="float32")
    h = block.create_var(name="h")
    block.append_op("rft_scale", inputs={"X": x}, outputs={"Out": h}, attrs={"scale": 2.0})
    block.create_var(name="out")
    block.append_op("rft_add", inputs={"X": "h", "Y": w}, outputs={"Out": "out"})
    return x, w


def test_output_variable_gets_its_shape_and_dtype_from_shape_inference(scratch_ops):
    block = rf.Program().global_block()
    _chain(block)
    assert block.var("h").shape == (-1, 3)
    assert block.var("h").dtype == "float32"


def test_op_without_role_guard_is_forward_and_attrs_get_defaults(scratch_ops):
    block = rf.Program().global_block()
    x = block.create_var(name="x", shape=[2], dtype="float64")
    op = block.append_op("rft_scale", inputs={"X": x}, outputs={"Out": "y"})
    assert op.attr("op_role") == 0
    assert op.attr("scale") == 1.0
    assert sorted(op.attr_names) == ["op_role", "scale"]
    assert op.input("X") == ["x"] and op.output("Out") == ["y"]
    assert op.input_arg_names == ["x"] and op.output_arg_names == ["y"]


def test_role_guards_set_op_role_and_op_role_var(scratch_ops):
    prog = rf.Program()
    block = prog.global_block()
    block.create_var(name="x", shape=[2])
    with prog._backward_role_guard():
        bwd = block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "y"})
    with prog._optimized_guard(["p", "p@GRAD"]):
        opt = block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "z"})
    after = block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "u"})
    assert bwd.attr("op_role") == OpRole.Backward
    assert opt.attr("op_role") == OpRole.Optimize
    assert opt.attr("op_role_var") == ["p", "p@GRAD"]
    assert after.attr("op_role") == OpRole.Forward and not after.has_attr("op_role_var")


def test_role_predicates_follow_paddle(scratch_ops):
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[1])

    def op_with_role(role):
        return block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "y"},
                               attrs={"op_role": role})

    loss_grad = op_with_role(OpRole.Backward | OpRole.Loss)
    assert int(loss_grad.attr("op_role")) == 257
    assert is_backward_op(loss_grad) and is_loss_grad_op(loss_grad)
    assert not is_loss_grad_op(op_with_role(OpRole.Backward))
    assert not is_loss_grad_op(op_with_role(OpRole.Loss))
    assert is_optimizer_op(op_with_role(OpRole.Optimize))
    assert not is_backward_op(op_with_role(OpRole.Forward))
    update = block.append_op("rft_update", inputs={"Param": "x", "Grad": "x",
                                                   "LearningRate": "x"},
                             outputs={"ParamOut": "x"})
    assert is_update_op(update) and not is_update_op(loss_grad)


@pytest.mark.parametrize("role, backward, loss_grad, optimizer", [
    (OpRole.Forward, False, False, False),
    (OpRole.Loss, False, False, False),
    (OpRole.Backward, True, False, False),
    (OpRole.Backward | OpRole.Loss, True, True, False),
    (OpRole.Optimize, False, False, True),
    (OpRole.Optimize | OpRole.LRSched, False, False, True),
    (OpRole.LRSched, False, False, False),
    (None, False, False, False),            # no op_role attr at all
])
def test_role_predicates_on_each_role(scratch_ops, role, backward, loss_grad, optimizer):
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[1])
    op = block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "y"})
    if role is None:
        del op.attrs["op_role"]
    else:
        op._set_attr("op_role", int(role))
    assert (is_backward_op(op), is_loss_grad_op(op), is_optimizer_op(op)) == (
        backward, loss_grad, optimizer)
    assert not is_update_op(op)


def test_unknown_op_type_fails_when_built():
    block = rf.Program().global_block()
    with pytest.raises(ProgramError, match="unknown op type 'no_such_op'"):
        block.append_op("no_such_op")


@pytest.mark.parametrize("inputs, outputs, message", [
    ({"X": "x", "Bogus": "x"}, {"Out": "y"}, "unknown input slot 'Bogus'"),
    ({}, {"Out": "y"}, "required input slot 'X' is missing"),
    ({"X": ["x", "x"]}, {"Out": "y"}, "input slot 'X' takes one variable, got 2"),
    ({"X": "undefined"}, {"Out": "y"}, "input variable 'undefined' is not defined"),
    ({"X": "x"}, {}, "required output slot 'Out' is missing"),
])
def test_bad_slots_fail_when_built_naming_op_and_slot(scratch_ops, inputs, outputs, message):
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[1])
    with pytest.raises(ProgramError, match=message) as err:
        block.append_op("rft_scale", inputs=inputs, outputs=outputs)
    assert "building op 'rft_scale' (would be op 0 of block 0)" in str(err.value)


def test_duplicable_slot_takes_several_variables(scratch_ops):
    block = rf.Program().global_block()
    for n in "abc":
        block.create_var(name=n, shape=[2])
    op = block.append_op("rft_concat", inputs={"X": ["a", "b", "c"]}, outputs={"Out": "y"})
    assert op.input("X") == ["a", "b", "c"]


def test_insert_and_remove_op_keep_order(scratch_ops):
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[1])
    for out in ("a", "c"):
        block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": out})
    block._insert_op(1, "rft_scale", inputs={"X": "x"}, outputs={"Out": "b"})
    assert [op.output("Out")[0] for op in block.ops] == ["a", "b", "c"]
    block._remove_op(0)
    assert [op.output("Out")[0] for op in block.ops] == ["b", "c"]


def test_inserted_op_that_fails_shape_inference_names_its_position(scratch_ops):
    block = rf.Program().global_block()
    block.create_var(name="a", shape=[2, 3])
    block.create_var(name="b", shape=[4, 3])
    for out in ("c", "d"):
        block.append_op("rft_scale", inputs={"X": "a"}, outputs={"Out": out})
    with pytest.raises(ProgramError, match=r"building op 'rft_add' \(would be op 1 of block 0\)"):
        block._insert_op(1, "rft_add", inputs={"X": "a", "Y": "b"}, outputs={"Out": "e"})
    assert [op.type for op in block.ops] == ["rft_scale", "rft_scale"]


def test_parameters_are_persistable_and_listed(scratch_ops):
    block = rf.Program().global_block()
    _chain(block)
    frozen = block.create_parameter("frozen", shape=[3], trainable=False)
    params = {p.name: p for p in block.iter_parameters()}
    assert sorted(params) == ["frozen", "w"]
    assert all(isinstance(p, Parameter) and p.persistable for p in params.values())
    assert frozen.stop_gradient and not params["w"].stop_gradient
    assert not params["w"].is_distributed


def test_block_var_finds_variables_and_names_a_missing_one():
    block = rf.Program().global_block()
    v = block.create_var(name="v", shape=[-1, 2], dtype="int64", persistable=True)
    assert block.var("v") is v and block.vars == {"v": v}
    assert (v.shape, v.dtype, v.persistable, v.stop_gradient) == ((-1, 2), "int64", True, False)
    assert block.create_var(name="v") is v        # Paddle: same name, same variable
    with pytest.raises(ProgramError, match="variable 'w' is not in block 0"):
        block.var("w")


def test_create_parameter_refuses_to_shadow_a_plain_variable():
    block = rf.Program().global_block()
    block.create_var(name="v", shape=[1])
    with pytest.raises(ProgramError, match="a variable of that name exists"):
        block.create_parameter("v", shape=[1])


def test_clone_is_independent_of_the_original(scratch_ops):
    prog = rf.Program()
    prog.random_seed = 7
    _chain(prog.global_block())
    copy = prog.clone()
    copy.global_block().ops[0]._set_attr("scale", 5.0)
    copy.global_block().var("w").optimize_attr["learning_rate"] = 0.5
    assert prog.global_block().ops[0].attr("scale") == 2.0
    assert prog.global_block().var("w").optimize_attr["learning_rate"] == 1.0
    assert copy.random_seed == 7
    assert copy.global_block().ops[0].block is copy.global_block()
    assert str(copy).replace("scale=5.0", "scale=2.0") == str(prog)


def test_clone_for_test_drops_backward_and_optimize_ops_and_sets_is_test(scratch_ops):
    prog = rf.Program()
    block = prog.global_block()
    block.create_var(name="x", shape=[2])
    block.append_op("rft_drop", inputs={"X": "x"}, outputs={"Out": "y"},
                    attrs={"op_role": OpRole.Forward | OpRole.Loss})
    with prog._backward_role_guard():
        block.append_op("rft_scale", inputs={"X": "y"}, outputs={"Out": "y@GRAD"})
    with prog._optimized_guard():
        block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "x"})
    test_prog = prog.clone(for_test=True)
    assert [op.type for op in test_prog.global_block().ops] == ["rft_drop"]
    assert test_prog.global_block().ops[0].attr("is_test") is True
    assert block.ops[0].attr("is_test") is False


def test_str_lists_every_variable_and_op_with_slots_attrs_and_role(scratch_ops):
    prog = rf.Program()
    _chain(prog.global_block())
    with prog._backward_role_guard():
        prog.global_block().append_op("rft_scale", inputs={"X": "out"}, outputs={"Out": "g"},
                                      attrs={"op_role": OpRole.Backward | OpRole.Loss})
    assert str(prog) == "\n".join([
        "program (random_seed=0, 1 block)",
        "block 0 { // 5 vars, 3 ops",
        "    data    x   : float32[-1, 3]",
        "    param   w   : float32[1, 3]",
        "    var     h   : float32[-1, 3]",
        "    var     out : float32[-1, 3]",
        "    var     g   : float32[-1, 3]",
        "",
        "    0  Forward        {Out=[h]} = rft_scale(X=[x]; scale=2.0)",
        "    1  Forward        {Out=[out]} = rft_add(X=[h], Y=[w])",
        "    2  Backward|Loss  {Out=[g]} = rft_scale(X=[out]; scale=1.0)",
        "}",
    ])


def test_one_op_prints_on_one_line_with_its_role_as_a_comment(scratch_ops):
    block = rf.Program().global_block()
    block.create_var(name="x", shape=[2])
    with block.program._optimized_guard(["p", "p@GRAD"]):
        op = block.append_op("rft_scale", inputs={"X": "x"}, outputs={"Out": "y"})
    assert repr(op) == ("{Out=[y]} = rft_scale(X=[x]; op_role_var=[p, p@GRAD], scale=1.0)"
                        "  # Optimize")


@pytest.mark.parametrize("role, name", [
    (0, "Forward"), (256, "Forward|Loss"), (257, "Backward|Loss"), (2, "Optimize"),
    (16, "LRSched"), (1 | 8, "Backward|Dist"), (4, "RPC"), (0x1000, "Forward|0x1000"),
])
def test_role_names_spell_out_the_bit_flags(role, name):
    assert role_name(role) == name


def test_variables_print_their_kind_dtype_shape_and_flags(scratch_ops):
    block = rf.Program().global_block()
    frozen = block.create_parameter("f", shape=[2], trainable=False, is_distributed=True)
    mask = block.create_var(name="m", shape=[-1, 2], dtype="uint8", stop_gradient=True)
    state = block.create_var(name="s", shape=[1], persistable=True, stop_gradient=True)
    assert repr(frozen) == "param f : float32[2], frozen, distributed"
    assert repr(mask) == "var m : uint8[-1, 2], stop_gradient"
    assert repr(state) == "persist s : float32[1]"


def test_program_guard_switches_default_programs_and_restores_them():
    main, startup = rf.Program(), rf.Program()
    outer_main = rf.default_main_program()
    with rf.program_guard(main, startup):
        assert rf.default_main_program() is main
        assert rf.default_startup_program() is startup
    assert rf.default_main_program() is outer_main


def test_program_guard_rejects_what_is_not_a_program():
    with pytest.raises(ProgramError, match="expects a Program, got str"), \
            rf.program_guard("main"):
        pass


def test_unique_names_skip_names_already_taken():
    prog = rf.Program()
    prog.global_block().create_var(name="tmp_0", shape=[1])
    assert prog.unique_name("tmp") == "tmp_1"


def test_shape_inference_failure_at_build_names_the_op(scratch_ops):
    block = rf.Program().global_block()
    block.create_var(name="a", shape=[2, 3])
    block.create_var(name="b", shape=[4, 3])
    with pytest.raises(ProgramError, match=r"building op 'rft_add' \(would be op 0 of block 0\)"
                       r": shape inference failed: Y\[4, 3\] does not broadcast to X\[2, 3\]"):
        block.append_op("rft_add", inputs={"X": "a", "Y": "b"}, outputs={"Out": "c"})
