"""verify: well-formed programs pass; programs mutated to be invalid are rejected with a
message naming the op index, type and variable and showing the ops around it."""

from __future__ import annotations

import pytest

import ringflow as rf
from ringflow.errors import ProgramError


@pytest.fixture
def mlp(net):
    """x -> fc(16, tanh) -> fc(4) -> softmax_with_cross_entropy -> mean, with backward and
    SGD: ops 0 matmul_v2, 1 elementwise_add, 2 tanh, 3 matmul_v2, 4 elementwise_add, ..."""
    x = rf.data("x", [-1, 8], "float32")
    y = rf.data("y", [-1, 1], "int64")
    loss = net.mean(net.xent(net.fc(net.fc(x, 16, act="tanh"), 4), y))
    rf.optimizer.SGD(0.1).minimize(loss)
    return net.main


def _ops(program):
    return program.global_block().ops


def test_training_program_and_its_startup_pass(mlp):
    assert rf.verify(mlp) is None
    assert rf.verify(rf.default_startup_program()) is None
    assert rf.verify(mlp.clone(for_test=True)) is None


def test_removed_producer_is_reported_at_the_first_use(mlp):
    tanh_out = _ops(mlp)[2].output("Out")[0]
    mlp.global_block()._remove_op(2)
    with pytest.raises(ProgramError) as err:
        rf.verify(mlp)
    message = str(err.value)
    assert message.startswith(
        f"verify: block 0, op 2 (matmul_v2): input X={tanh_out!r} is used before any op "
        f"produces it (it is not a parameter, a persistable or a data variable)")
    lines = message.splitlines()
    assert lines[1] == "  ops around it:"
    assert [line.split(":")[0] for line in lines[2:]] == [
        "        0", "        1", "  >>>   2", "        3", "        4"]
    assert f"matmul_v2(X=[{tanh_out}]" in lines[4] and lines[4].endswith("# Forward")


def test_renamed_input_variable_is_reported(mlp):
    _ops(mlp)[3].inputs["Y"] = ["fc_1.w_O"]
    with pytest.raises(ProgramError, match=r"op 3 \(matmul_v2\): input Y='fc_1.w_O' is not "
                                           r"a variable of block 0"):
        rf.verify(mlp)


def test_declared_shape_that_disagrees_with_shape_inference_is_reported(mlp):
    name = _ops(mlp)[0].output("Out")[0]
    mlp.global_block().var(name).shape = (-1, 15)
    with pytest.raises(ProgramError, match=rf"op 0 \(matmul_v2\): output Out='{name}' is "
                                           r"declared float32\[-1, 15\] but matmul_v2 "
                                           r"computes float32\[-1, 16\] from its inputs"):
        rf.verify(mlp)


def test_declared_dtype_that_disagrees_is_reported(mlp):
    name = _ops(mlp)[2].output("Out")[0]
    mlp.global_block().var(name).dtype = "float64"
    with pytest.raises(ProgramError, match=rf"op 2 \(tanh\): output Out='{name}' is declared "
                                           r"float64\[-1, 16\] but tanh computes float32"):
        rf.verify(mlp)


def test_inputs_whose_shapes_do_not_fit_are_reported(mlp):
    mlp.global_block().var("fc_1.w_0").shape = (15, 4)
    with pytest.raises(ProgramError, match=r"op 3 \(matmul_v2\): shape inference failed"):
        rf.verify(mlp)


def test_unknown_op_type_set_after_build_is_reported(mlp):
    _ops(mlp)[4].type = "elementwise_plus"
    with pytest.raises(ProgramError, match=r"op 4 \(elementwise_plus\): unknown op type "
                                           r"'elementwise_plus'"):
        rf.verify(mlp)


def test_missing_required_slot_is_reported(mlp):
    del _ops(mlp)[1].inputs["Y"]
    with pytest.raises(ProgramError, match=r"op 1 \(elementwise_add\): required input slot "
                                           r"'Y' is missing"):
        rf.verify(mlp)


def test_unknown_slot_and_too_many_variables_are_reported(mlp):
    _ops(mlp)[2].inputs["Bias"] = ["fc_0.b_0"]
    with pytest.raises(ProgramError, match=r"op 2 \(tanh\): unknown input slot 'Bias'"):
        rf.verify(mlp)
    del _ops(mlp)[2].inputs["Bias"]
    _ops(mlp)[2].inputs["X"].append("x")
    with pytest.raises(ProgramError, match=r"op 2 \(tanh\): input slot 'X' takes one "
                                           r"variable, got 2"):
        rf.verify(mlp)


def test_attr_of_the_wrong_type_is_reported(mlp):
    _ops(mlp)[0]._set_attr("trans_y", "yes")
    with pytest.raises(ProgramError, match=r"op 0 \(matmul_v2\): attr trans_y='yes' is a str; "
                                           r"matmul_v2 expects a bool like its default False"):
        rf.verify(mlp)


def test_odd_op_role_var_is_reported(mlp):
    sgd = next(i for i, op in enumerate(_ops(mlp)) if op.type == "sgd")
    _ops(mlp)[sgd]._set_attr("op_role_var", ["fc_0.b_0"])
    with pytest.raises(ProgramError, match=rf"op {sgd} \(sgd\): attr op_role_var=\['fc_0.b_0'\] "
                                           r"must be a flat list of \[param, grad\] pairs"):
        rf.verify(mlp)


@pytest.mark.parametrize("role, message", [
    (None, "attr op_role is missing: every op carries its role"),
    ("backward", "attr op_role='backward' must be an int"),
    (True, "attr op_role=True must be an int"),
])
def test_op_without_an_int_op_role_is_reported(mlp, role, message):
    if role is None:
        del _ops(mlp)[1].attrs["op_role"]
    else:
        _ops(mlp)[1]._set_attr("op_role", role)
    with pytest.raises(ProgramError, match=r"op 1 \(elementwise_add\): " + message):
        rf.verify(mlp)


def test_verify_rejects_what_is_not_a_program():
    with pytest.raises(ProgramError, match="verify expects a Program, got list"):
        rf.verify([])


def test_adam_with_global_norm_clip_program_passes(net):
    x = rf.data("x", [-1, 8], "float32")
    loss = net.mean(net.fc(net.fc(x, 16, act="relu"), 4))
    opt = rf.optimizer.Adam(1e-3, grad_clip=rf.ClipGradByGlobalNorm(1.0))
    opt.minimize(loss)
    assert rf.verify(net.main) is None
    assert rf.verify(rf.default_startup_program()) is None
