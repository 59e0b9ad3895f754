"""append_backward and gradients: Paddle's op sequence and roles, accumulation, pruning,
and gradients equal to central finite differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

import ringflow as rf
from ringflow.errors import ProgramError
from ringflow.framework.layer_helper import create_parameter
from ringflow.framework.registry import OpDesc, _unregister_op, grad_var_name, register_op

F64 = "float64"


def _mlp(net, dtype="float32"):
    x = rf.data("x", [-1, 8], dtype)
    y = rf.data("y", [-1, 1], "int64")
    h = net.fc(x, 16, act="tanh")
    return net.mean(net.xent(net.fc(h, 4), y))


def _roles(program):
    return [(op.type, int(op.attr("op_role"))) for op in program.global_block().ops]


def test_fc_tanh_fc_softmax_mean_has_paddles_op_sequence_and_roles(net):
    # reference/paddle-semantics.md 1.5, with ringflow's fc = matmul_v2 + elementwise_add.
    loss = _mlp(net)
    rf.append_backward(loss)
    assert _roles(net.main) == [
        ("matmul_v2", 0), ("elementwise_add", 0), ("tanh", 0), ("matmul_v2", 0),
        ("elementwise_add", 0), ("softmax_with_cross_entropy", 0), ("reduce_mean", 256),
        ("fill_constant", 257), ("reduce_mean_grad", 1),
        ("softmax_with_cross_entropy_grad", 1), ("elementwise_add_grad", 1),
        ("matmul_v2_grad", 1), ("tanh_grad", 1), ("elementwise_add_grad", 1),
        ("matmul_v2_grad", 1)]


def test_nn_model_with_sgd_reads_like_paddles_program(net):
    # The whole of reference/paddle-semantics.md 1.5: forward, backward, then sgd(2) x4
    # sorted by parameter name, each update carrying [param, grad].
    x = rf.data("x", [-1, 8], "float32")
    y = rf.data("y", [-1, 1], "int64")
    h = rf.nn.fc(x, 16, activation="tanh")
    loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(h, 4), y))
    rf.optimizer.SGD(0.1).minimize(loss)
    roles = _roles(net.main)
    assert [r for _, r in roles] == [0] * 6 + [256, 257] + [1] * 7 + [2] * 4
    assert [t for t, _ in roles][6:9] == ["reduce_mean", "fill_constant", "reduce_mean_grad"]
    updates = [op.attr("op_role_var") for op in net.block.ops if op.type == "sgd"]
    assert updates == [[p, p + "@GRAD"] for p in ("fc_0.b_0", "fc_0.w_0", "fc_1.b_0",
                                                  "fc_1.w_0")]
    assert rf.verify(net.main) is None


def test_loss_grad_is_fill_constant_one_into_loss_at_grad(net):
    loss = _mlp(net)
    rf.append_backward(loss)
    op = net.block.ops[7]
    # DESIGN.md: the gradient of v is the variable v@GRAD (whatever counter named the loss)
    assert op.output("Out") == [grad_var_name(loss.name)] == [loss.name + "@GRAD"]
    assert (op.attr("shape"), op.attr("value"), op.attr("dtype")) == ([1], 1.0, "float32")
    assert rf.framework.is_loss_grad_op(op)


def test_params_grads_and_op_role_var_on_the_last_writer(net):
    loss = _mlp(net)
    params_grads = rf.append_backward(loss)
    names = [(p.name, g.name) for p, g in params_grads]
    assert names == [("fc_0.w_0", "fc_0.w_0@GRAD"), ("fc_0.b_0", "fc_0.b_0@GRAD"),
                     ("fc_1.w_0", "fc_1.w_0@GRAD"), ("fc_1.b_0", "fc_1.b_0@GRAD")]
    role_vars = [(op.type, op.attr("op_role_var")) for op in net.block.ops
                 if op.has_attr("op_role_var")]
    assert role_vars == [
        ("elementwise_add_grad", ["fc_1.b_0", "fc_1.b_0@GRAD"]),
        ("matmul_v2_grad", ["fc_1.w_0", "fc_1.w_0@GRAD"]),
        ("elementwise_add_grad", ["fc_0.b_0", "fc_0.b_0@GRAD"]),
        ("matmul_v2_grad", ["fc_0.w_0", "fc_0.w_0@GRAD"])]
    for p, g in params_grads:
        assert (g.shape, g.dtype) == (p.shape, p.dtype)


def test_op_role_var_pairs_are_prepended_when_one_op_writes_two_gradients(net):
    a = create_parameter([3, 3], F64, attr="a")
    b = create_parameter([3, 3], F64, attr="b")
    loss = net.mean(net.op("matmul_v2", X=a, Y=b))
    rf.append_backward(loss)
    assert net.block.ops[-1].attr("op_role_var") == ["b", "b@GRAD", "a", "a@GRAD"]


def test_data_variables_get_no_gradient(net):
    loss = _mlp(net)
    rf.append_backward(loss)
    first_matmul_grad = net.block.ops[-1]
    assert first_matmul_grad.output("X@GRAD") == ["@EMPTY@"]
    assert not net.block.has_var("x@GRAD") and not net.block.has_var("y@GRAD")


def _grad_types(net):
    return [op.type for op in net.block.ops if int(op.attr("op_role")) == 1]


def test_no_grad_set_parameter_gets_no_gradient(net):
    loss = _mlp(net)
    params_grads = rf.append_backward(loss, no_grad_set={"fc_0.w_0"})
    assert [p.name for p, _ in params_grads] == ["fc_0.b_0", "fc_1.w_0", "fc_1.b_0"]
    assert _grad_types(net)[-1] == "elementwise_add_grad"   # the first matmul_v2 is pruned


def test_no_grad_set_variable_cuts_everything_before_it(net):
    x = rf.data("x", [-1, 8], "float32")
    h = net.fc(x, 16, act="tanh")
    loss = net.mean(net.fc(h, 4))
    params_grads = rf.append_backward(loss, no_grad_set=[h])
    assert [p.name for p, _ in params_grads] == ["fc_1.w_0", "fc_1.b_0"]
    assert _grad_types(net) == ["reduce_mean_grad", "elementwise_add_grad", "matmul_v2_grad"]
    assert net.block.ops[-1].output("X@GRAD") == ["@EMPTY@"]


def test_stop_gradient_variable_cuts_like_no_grad_set(net):
    x = rf.data("x", [-1, 8], "float32")
    h = net.fc(x, 16, act="tanh")
    h.stop_gradient = True
    params_grads = rf.append_backward(net.mean(net.fc(h, 4)))
    assert [p.name for p, _ in params_grads] == ["fc_1.w_0", "fc_1.b_0"]


def test_frozen_parameter_gets_no_gradient_and_parameter_list_filters(net):
    x = rf.data("x", [-1, 8], "float32")
    frozen = create_parameter([8, 4], "float32", attr=rf.ParamAttr(trainable=False))
    loss = net.mean(net.fc(net.fc(x, 4, weight=frozen, bias=False), 2))
    params_grads = rf.append_backward(loss, parameter_list=["fc_1.w_0"])
    assert [p.name for p, _ in params_grads] == ["fc_1.w_0"]
    assert not net.block.has_var(grad_var_name(frozen.name))
    assert net.block.has_var("fc_1.b_0@GRAD")        # computed, just not returned


def _numeric_grad(program, scope, feed, loss, name, eps=1e-6):
    """Central differences of ``loss`` with respect to scope[name], on a forward clone."""
    fwd, exe = program.clone(for_test=True), rf.Executor()
    value = scope[name]
    grad = np.zeros_like(value)
    for i in np.ndindex(value.shape):
        old = value[i]
        value[i] = old + eps
        hi = exe.run(fwd, feed=feed, fetch_list=[loss], scope=scope)[0].item()
        value[i] = old - eps
        lo = exe.run(fwd, feed=feed, fetch_list=[loss], scope=scope)[0].item()
        value[i] = old
        grad[i] = (hi - lo) / (2 * eps)
    return grad


def _check_grads(net, loss, params_grads, feed):
    scope = rf.Scope()
    rf.Executor().run(rf.default_startup_program(), scope=scope)
    fetched = rf.Executor().run(net.main, feed=feed, fetch_list=[g for _, g in params_grads],
                                scope=scope)
    for (p, _), got in zip(params_grads, fetched):
        want = _numeric_grad(net.main, scope, feed, loss, p.name)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8, err_msg=p.name)


def test_mlp_gradients_equal_finite_differences(net):
    loss = _mlp(net, F64)
    params_grads = rf.append_backward(loss)
    rng = np.random.default_rng(0)
    _check_grads(net, loss, params_grads,
                 {"x": rng.normal(size=(5, 8)), "y": rng.integers(0, 4, (5, 1))})


def test_gradient_of_a_variable_used_twice_is_the_sum_of_both_uses(net):
    x = rf.data("x", [-1, 3], F64)
    h = net.fc(x, 4, bias=False)
    s = net.op("elementwise_add", X=h, Y=net.op("tanh", X=h))      # h feeds two ops
    loss = net.mean(s)
    params_grads = rf.append_backward(loss)
    sums = [op for op in net.block.ops if op.type == "sum"]
    assert [(op.input("X"), op.output("Out"), int(op.attr("op_role"))) for op in sums] == [
        ([f"{h.name}@GRAD@RENAME@0", f"{h.name}@GRAD@RENAME@1"], [f"{h.name}@GRAD"], 1)]
    _check_grads(net, loss, params_grads, {"x": np.random.default_rng(1).normal(size=(2, 3))})


def test_shared_parameter_gradient_is_summed_and_the_sum_carries_op_role_var(net):
    x = rf.data("x", [-1, 3], F64)
    w = create_parameter([3, 3], F64, attr="shared")
    loss = net.mean(net.op("tanh", X=net.fc(net.fc(x, 3, weight=w, bias=False), 3, weight=w,
                                           bias=False)))
    params_grads = rf.append_backward(loss)
    last = net.block.ops[-1]
    assert (last.type, last.output("Out")) == ("sum", ["shared@GRAD"])
    assert last.attr("op_role_var") == ["shared", "shared@GRAD"]
    _check_grads(net, loss, params_grads, {"x": np.random.default_rng(2).normal(size=(2, 3))})


def test_same_input_twice_in_one_op_gets_both_partials(net):
    w = create_parameter([2, 2], F64, attr="w", default_initializer=rf.initializer.Normal())
    loss = net.mean(net.op("elementwise_mul", X=w, Y=w))
    params_grads = rf.append_backward(loss)
    assert net.block.ops[-1].type == "sum"
    _check_grads(net, loss, params_grads, {})


@pytest.fixture
def split_op(scratch_ops):
    """A two-output op whose grad op reads both output gradients (like Paddle's split)."""
    def maker(op, no_grad):
        return [OpDesc("rft_concat", {"X": [grad_var_name(n) for n in op.output("Out")]},
                       {"Out": [grad_var_name(op.input("X")[0])]}, {"axis": 0})]

    def infer(ctx):
        n, *rest = ctx.input_shape("X")
        for i in range(2):
            ctx.set_output("Out", [n // 2, *rest], ctx.input_dtype("X"), i)

    register_op("rft_halves", inputs=["X"], outputs=["Out*"], infer_shape=infer, grad=maker)(
        lambda ctx: ctx.set_outputs("Out", np.split(ctx.input("X"), 2)))
    yield
    _unregister_op("rft_halves")


def test_gradient_of_an_unused_output_is_zero_filled(net, split_op):
    w = create_parameter([4, 2], F64, attr="w", default_initializer=rf.initializer.Normal())
    net.block.append_op("rft_halves", inputs={"X": w}, outputs={"Out": ["top", "bottom"]})
    loss = net.mean(net.op("tanh", X="top"))
    params_grads = rf.append_backward(loss)
    zero = [op for op in net.block.ops if op.type == "fill_zeros_like"]
    assert [(op.input("X"), op.output("Out")) for op in zero] == [(["bottom"],
                                                                    ["bottom@GRAD"])]
    _check_grads(net, loss, params_grads, {})


def test_op_without_gradient_on_the_path_is_an_error(net, scratch_ops):
    w = create_parameter([3], F64, attr="w")
    loss = net.mean(net.op("rft_log", X=w))
    with pytest.raises(ProgramError, match=r"op 0 \(rft_log\) has no gradient, but its inputs "
                                           r"\['w'\] need one"):
        rf.append_backward(loss)


def test_loss_of_unknown_shape_is_rejected(net):
    x = rf.data("x", [-1, 3], "float32")
    with pytest.raises(ProgramError, match=r"has shape \[-1, 3\]: append_backward needs a "
                                           r"loss of known shape"):
        rf.append_backward(net.fc(x, 3))


def test_long_chain_is_walked_without_recursion(net):
    w = create_parameter([2], F64, attr="w", default_initializer=rf.initializer.Constant(1.0))
    h = w
    for _ in range(1500):
        h = net.op("scale", X=h, attrs={"scale": 1.001})
    params_grads = rf.append_backward(net.op("reduce_sum", X=h, attrs={"reduce_all": True}))
    scope = rf.Scope()
    rf.Executor().run(rf.default_startup_program(), scope=scope)
    (g,) = rf.Executor().run(net.main, fetch_list=[params_grads[0][1]], scope=scope)
    np.testing.assert_allclose(g, [1.001 ** 1500] * 2, rtol=1e-12)


def test_callbacks_see_every_grad_op(net):
    seen = []
    rf.append_backward(_mlp(net), callbacks=[
        lambda block, context: seen.append(context["__current_op_desc__"].type)])
    assert seen == _grad_types(net)


def test_gradients_of_targets_with_respect_to_data_inputs(net):
    x = rf.data("x", [-1, 3], F64)
    z = rf.data("z", [-1, 3], F64)
    t = net.op("tanh", X=x)
    weight = rf.data("dt", [-1, 3], F64)
    gx, gz = rf.gradients([t], [x, z], target_gradients=[weight])
    assert gz is None and gx.name == "x@GRAD"
    xv = np.random.default_rng(3).normal(size=(2, 3))
    wv = np.random.default_rng(4).normal(size=(2, 3))
    (got,) = rf.Executor().run(net.main, feed={"x": xv, "dt": wv}, fetch_list=[gx],
                               scope=rf.Scope())
    np.testing.assert_allclose(got, wv * (1 - np.tanh(xv) ** 2), rtol=1e-12)


def test_gradients_default_target_gradient_is_ones_of_the_batch_shape(net):
    x = rf.data("x", [-1, 2], F64)
    (gx,) = rf.gradients(net.op("scale", X=x, attrs={"scale": 3.0}), x)
    (got,) = rf.Executor().run(net.main, feed={"x": np.zeros((4, 2))}, fetch_list=[gx],
                               scope=rf.Scope())
    np.testing.assert_array_equal(got, np.full((4, 2), 3.0))


def test_in_place_op_gradient_is_not_summed_with_the_later_version(net):
    # h = x W; a = tanh(h); h = 2 h (in place); loss = mean(h + a): dh = 2 dc + tanh'(h) dc
    x = rf.data("x", [-1, 3], F64)
    w = create_parameter([3, 3], F64, attr="w")
    h = net.op("matmul_v2", X=x, Y=w)
    a = net.op("tanh", X=h)
    net.block.append_op("scale", inputs={"X": h}, outputs={"Out": h}, attrs={"scale": 2.0})
    loss = net.mean(net.op("elementwise_add", X=h, Y=a))
    params_grads = rf.append_backward(loss)
    scale_grad = next(op for op in net.block.ops[6:] if op.type == "scale")
    assert scale_grad.input("X") == [f"{h.name}@GRAD"]
    assert scale_grad.output("Out") == [f"{h.name}@GRAD@RENAME@0"]
    scope = rf.Scope()
    rf.Executor().run(rf.default_startup_program(), scope=scope)
    xv = np.random.default_rng(5).normal(size=(2, 3))
    (got,) = rf.Executor().run(net.main, feed={"x": xv}, fetch_list=[params_grads[0][1]],
                               scope=scope)
    dc = np.full((2, 3), 1 / 6)
    dh = 2 * dc + (1 - np.tanh(xv @ scope["w"]) ** 2) * dc
    np.testing.assert_allclose(got, xv.T @ dh, rtol=1e-12)


def test_gradients_through_every_layer_kind_equal_finite_differences(net):
    # rf.nn layers end to end in float64: embedding, concat, layer_norm, transpose, reshape,
    # fc with activations, split and slice, a variable used twice, softmax, the loss
    ids = rf.data("ids", [-1, 3], "int64")
    x = rf.data("x", [-1, 3, 4], F64)
    y = rf.data("y", [-1], "int64")
    h = rf.nn.concat([rf.nn.embedding(ids, [7, 4], dtype=F64), x], axis=2)
    h = rf.nn.layer_norm(h, begin_norm_axis=2)
    h = rf.nn.reshape(rf.nn.transpose(h, [0, 2, 1]), [0, 24])
    h = rf.nn.fc(h, 5, activation="gelu")
    first, rest = rf.nn.split(h, [2, 3], axis=1)
    h = rf.nn.concat([rf.nn.slice(rest, [1], [1], [3]), first, rest], axis=1)
    h = rf.nn.add(h, rf.nn.sigmoid(rf.nn.fc(h, 7, activation="tanh")))
    logits = rf.nn.fc(rf.nn.softmax(h), 3)
    loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))
    params_grads = rf.append_backward(loss)
    assert len(params_grads) == 9        # embedding, layer_norm scale and bias, 3 x fc w, b
    rng = np.random.default_rng(5)
    _check_grads(net, loss, params_grads, {"ids": rng.integers(0, 7, (4, 3)),
                                           "x": rng.normal(size=(4, 3, 4)),
                                           "y": rng.integers(0, 3, 4)})
