"""data, ParamAttr and create_parameter: what layer functions build on."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.errors import ProgramError
from ringflow.framework.layer_helper import create_parameter


@pytest.fixture
def programs():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        yield main, startup


def test_data_is_a_fed_input_that_needs_no_gradient(programs):
    main, _ = programs
    x = rf.data("x", shape=[None, 4], dtype="int64")
    assert main.global_block().var("x") is x
    assert (x.shape, x.dtype, x.is_data, x.stop_gradient) == ((-1, 4), "int64", True, True)
    assert rf.data("x", shape=[-1, 4], dtype="int64") is x


def test_data_redeclared_differently_is_an_error(programs):
    rf.data("x", shape=[-1, 4])
    with pytest.raises(ProgramError,
                       match=r"data 'x': the program already has data x : float32\[-1, 4\]"):
        rf.data("x", shape=[-1, 5])


def test_parameter_goes_to_main_and_its_initializer_to_startup(programs):
    main, startup = programs
    w = create_parameter([4, 3], "float32")
    b = create_parameter([3], "float32", is_bias=True)
    assert (w.name, b.name) == ("fc_0.w_0", "fc_0.b_0")
    assert [p.name for p in main.all_parameters()] == ["fc_0.w_0", "fc_0.b_0"]
    assert [p.name for p in startup.all_parameters()] == ["fc_0.w_0", "fc_0.b_0"]
    assert not main.global_block().ops
    ops = startup.global_block().ops
    assert [(op.type, op.output("Out")) for op in ops] == [
        ("uniform_random", ["fc_0.w_0"]), ("fill_constant", ["fc_0.b_0"])]
    assert ops[1].attr("value") == 0.0
    # the parameter remembers its initializer: XavierUniform for weights, zero for biases
    assert isinstance(w.initializer, rf.initializer.XavierUniform)
    assert isinstance(b.initializer, rf.initializer.Constant) and b.initializer.value == 0.0


def test_generated_names_number_layers_per_prefix(programs):
    names = [create_parameter([2, 2], "float32").name,
             create_parameter([2], "float32", is_bias=True).name,
             create_parameter([2, 2], "float32").name,            # a layer without bias
             create_parameter([2, 2], "float32").name,
             create_parameter([2], "float32", is_bias=True).name,
             create_parameter([2], "float32", prefix="layer_norm").name,
             create_parameter([2], "float32", layer_name="head").name,
             create_parameter([2], "float32", layer_name="head").name]
    assert names == ["fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_2.w_0", "fc_2.b_0",
                     "layer_norm_0.w_0", "head.w_0", "head.w_1"]


def test_param_attr_sets_name_initializer_learning_rate_and_trainable(programs):
    _, startup = programs
    attr = rf.ParamAttr(name="emb", initializer=rf.initializer.Constant(2.0),
                        learning_rate=0.1, trainable=False, need_clip=False)
    p = create_parameter([5, 2], "float64", attr=attr)
    assert p.name == "emb" and p.dtype == "float64"
    assert p.optimize_attr["learning_rate"] == 0.1
    assert not p.trainable and p.stop_gradient and not p.need_clip
    assert p.initializer is attr.initializer and not p.is_distributed
    op = startup.global_block().ops[0]
    assert (op.type, op.attr("value"), op.attr("dtype")) == ("fill_constant", 2.0, "float64")


def test_attr_shorthands_are_name_initializer_and_false(programs):
    _, startup = programs
    assert create_parameter([2], "float32", attr="named").name == "named"
    create_parameter([2], "float32", attr=rf.initializer.Normal(0.0, 2.0))
    assert startup.global_block().ops[-1].attr("std") == 2.0
    assert create_parameter([2], "float32", attr=False, is_bias=True) is None
    with pytest.raises(ProgramError, match="must be a ParamAttr, a name, an Initializer"):
        create_parameter([2], "float32", attr=3)


def test_same_name_shares_the_parameter_and_initialises_it_once(programs):
    _, startup = programs
    a = create_parameter([3, 3], "float32", attr="shared")
    b = create_parameter([3, 3], "float32", attr="shared")
    assert a is b
    assert len(startup.global_block().ops) == 1
    with pytest.raises(ProgramError, match=r"exists as float32\[3, 3\]; cannot reuse it as "
                                           r"float32\[3, 4\]"):
        create_parameter([3, 4], "float32", attr="shared")


def test_parameter_shape_must_be_known(programs):
    with pytest.raises(ProgramError, match=r"shape \[-1, 3\] must be fully known"):
        create_parameter([-1, 3], "float32")
