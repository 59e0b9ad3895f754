"""Parameter update ops (Paddle's names and slots): sgd, momentum, adam, adamw, lamb,
lars_momentum; and squared_l2_norm, the per-gradient piece of global-norm clipping.

Updates are in place: ``ParamOut`` is normally the ``Param`` variable itself, so the kernel
writes into the parameter's array (and the moments') chunk by chunk (``_chunked``) instead
of allocating new ones. Scalars (learning rate, beta powers) are one-element arrays. The
arithmetic is in ``update_math``, which the fused update step (compiler/fuse_optimizer.py)
runs over many parameters at once.
"""

from __future__ import annotations

import numpy as np

from ..framework.registry import make_grad_op, register_op
from . import update_math as um


def _state(ctx, in_slot: str, out_slot: str) -> np.ndarray:
    """The array ``out_slot`` ends up holding, to be updated in place: the input array
    itself when the op writes back to the same variable and the executor owns the array
    (the executor's one ownership rule); else a private contiguous copy, which the
    executor adopts and which becomes the output. So an array a user put into the scope is
    never written behind their back."""
    arr = ctx.input(in_slot)
    name = ctx.op.inputs[in_slot][0]
    if name == ctx.op.outputs[out_slot][0] and ctx.executor.owns(name, arr):
        return arr
    own = np.array(arr, order="C", copy=True)
    ctx.executor.adopt(ctx.op.outputs[out_slot][0], own)
    ctx.set_output(out_slot, own)
    return own


def _lr(ctx) -> float:
    return float(ctx.input("LearningRate").reshape(-1)[0])


def _flat(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.reshape(-1) for a in arrays]


def _check_same_shape(ctx, *slots: str) -> None:
    shapes = {s: ctx.input(s).shape for s in slots}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"{ctx.op.type}: inputs must have one shape, got {shapes}")


def _infer_like(*pairs: tuple[str, str]):
    def infer(ctx) -> None:
        for in_slot, out_slot in pairs:
            if ctx.has_input(in_slot):
                ctx.set_output(out_slot, ctx.input_shape(in_slot), ctx.input_dtype(in_slot))

    return infer


_MOMENT_PAIRS = (("Param", "ParamOut"), ("Moment1", "Moment1Out"), ("Moment2", "Moment2Out"),
                 ("Beta1Pow", "Beta1PowOut"), ("Beta2Pow", "Beta2PowOut"))
_ADAM_IN = ["Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow"]
_ADAM_OUT = ["ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut", "Beta2PowOut"]


# sgd: p -= lr * g --------------------------------------------------------------------------
@register_op("sgd", inputs=["Param", "Grad", "LearningRate"], outputs=["ParamOut"],
             infer_shape=_infer_like(("Param", "ParamOut")))
def _sgd(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad")
    p, g = _flat(_state(ctx, "Param", "ParamOut"), ctx.input("Grad"))
    um.sgd(p, g, _lr(ctx))


# momentum: v = mu v + g (+ l2 decay); p -= lr v, or lr (g + mu v) with Nesterov ------------
def momentum_decay(attr) -> float:
    """The L2 decay coefficient a momentum op applies (0 unless ``l2_decay``)."""
    if attr("regularization_method") != "l2_decay":
        return 0.0
    return float(attr("regularization_coeff") or 0.0)


@register_op("momentum", inputs=["Param", "Grad", "Velocity", "LearningRate"],
             outputs=["ParamOut", "VelocityOut"],
             attrs={"mu": 0.9, "use_nesterov": False, "regularization_method": "",
                    "regularization_coeff": 0.0},
             infer_shape=_infer_like(("Param", "ParamOut"), ("Velocity", "VelocityOut")))
def _momentum(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Velocity")
    p = _state(ctx, "Param", "ParamOut").reshape(-1)
    v = _state(ctx, "Velocity", "VelocityOut").reshape(-1)
    um.momentum(p, v, ctx.input("Grad").reshape(-1), _lr(ctx), float(ctx.attr("mu")),
                bool(ctx.attr("use_nesterov")), momentum_decay(ctx.attr))


# adam / adamw ------------------------------------------------------------------------------
def adam_decay(op_type: str, attr) -> tuple[float, float]:
    """(decoupled decay coefficient, lr ratio) of an adam or adamw op."""
    if op_type != "adamw":
        return 0.0, 1.0
    return (float(attr("coeff")) if attr("with_decay") else 0.0), float(attr("lr_ratio"))


def _adam_family(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Moment1", "Moment2")
    decay, ratio = adam_decay(ctx.op.type, ctx.attr)
    lr = _lr(ctx) * ratio
    b1, b2, eps = (float(ctx.attr(k)) for k in ("beta1", "beta2", "epsilon"))
    b1p, b2p = ctx.input("Beta1Pow"), ctx.input("Beta2Pow")
    lr_t, eps_t = um.adam_scalars(lr, float(b1p.reshape(-1)[0]), float(b2p.reshape(-1)[0]),
                                  eps)
    p, m, v = (_state(ctx, a, b).reshape(-1) for a, b in _MOMENT_PAIRS[:3])
    um.adam(p, m, v, ctx.input("Grad").reshape(-1), b1, b2, lr_t, eps_t,
            1.0 - lr * decay if decay else None)
    ctx.set_output("Beta1PowOut", b1p * b1)
    ctx.set_output("Beta2PowOut", b2p * b2)


register_op("adam", inputs=_ADAM_IN, outputs=_ADAM_OUT,
            attrs={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
            infer_shape=_infer_like(*_MOMENT_PAIRS))(_adam_family)
register_op("adamw", inputs=_ADAM_IN, outputs=_ADAM_OUT,
            attrs={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "coeff": 0.01,
                   "with_decay": True, "lr_ratio": 1.0},
            infer_shape=_infer_like(*_MOMENT_PAIRS))(_adam_family)


# lamb: r = m_hat / (sqrt(v_hat) + eps) + wd p; p -= lr (|p| / |r|) r -----------------------
def lamb_attrs(attr, b1_pow: float, b2_pow: float) -> tuple:
    """(b1, b2, eps, wd, 1 - b1^t, 1 - b2^t) for ``update_math.lamb_direction``."""
    return (float(attr("beta1")), float(attr("beta2")), float(attr("epsilon")),
            float(attr("weight_decay")), 1.0 - b1_pow, 1.0 - b2_pow)


@register_op("lamb", inputs=_ADAM_IN, outputs=_ADAM_OUT,
             attrs={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6, "weight_decay": 0.01,
                    "ring_id": -1},
             infer_shape=_infer_like(*_MOMENT_PAIRS))
def _lamb(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Moment1", "Moment2")
    p, m, v = (_state(ctx, a, b).reshape(-1) for a, b in _MOMENT_PAIRS[:3])
    r = um.lamb_buffer(ctx.op.inputs["Param"][0], p.size, p.dtype)
    b1p, b2p = ctx.input("Beta1Pow"), ctx.input("Beta2Pow")
    scalars = lamb_attrs(ctx.attr, float(b1p.reshape(-1)[0]), float(b2p.reshape(-1)[0]))
    sums = um.lamb_direction(p, m, v, ctx.input("Grad").reshape(-1), r, *scalars)
    p_sq, r_sq = um.all_reduce_sums(int(ctx.attr("ring_id")), list(sums))
    um.lamb_apply(p, r, _lr(ctx) * um.lamb_trust(p_sq, r_sq))
    ctx.set_output("Beta1PowOut", b1p * float(ctx.attr("beta1")))
    ctx.set_output("Beta2PowOut", b2p * float(ctx.attr("beta2")))


# lars_momentum: local_lr = lr c |p| / (|g| + wd |p| + eps); v = mu v + local_lr (g + wd p);
# p -= v. With |p| or |g| zero (or wd zero), local_lr = lr, as Paddle's kernel.
@register_op("lars_momentum", inputs=["Param", "Grad", "Velocity", "LearningRate"],
             outputs=["ParamOut", "VelocityOut"],
             attrs={"mu": 0.9, "lars_coeff": 0.001, "lars_weight_decay": 0.0005,
                    "epsilon": 0.0, "ring_id": -1},
             infer_shape=_infer_like(("Param", "ParamOut"), ("Velocity", "VelocityOut")))
def _lars_momentum(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Velocity")
    wd = float(ctx.attr("lars_weight_decay"))
    p = _state(ctx, "Param", "ParamOut").reshape(-1)
    v = _state(ctx, "Velocity", "VelocityOut").reshape(-1)
    g = ctx.input("Grad").reshape(-1)
    p_sq, g_sq = um.all_reduce_sums(int(ctx.attr("ring_id")),
                                    [float(np.dot(p, p)), float(np.dot(g, g))])
    local_lr = um.lars_local_lr(_lr(ctx), float(ctx.attr("lars_coeff")), wd,
                                float(ctx.attr("epsilon")), p_sq, g_sq)
    um.lars(p, v, g, local_lr, float(ctx.attr("mu")), wd)


# squared_l2_norm: Out = [sum(X^2)], the per-gradient term of the global norm ----------------
def _infer_scalar(ctx) -> None:
    ctx.set_output("Out", (1,), ctx.input_dtype("X"))


@register_op("squared_l2_norm", inputs=["X"], outputs=["Out"], infer_shape=_infer_scalar,
             grad=make_grad_op("squared_l2_norm_grad", fwd_inputs=["X"]))
def _squared_l2_norm(ctx) -> None:
    x = ctx.input("X").reshape(-1)
    ctx.set_output("Out", np.array([np.dot(x, x)], dtype=x.dtype))


@register_op("squared_l2_norm_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
             infer_shape=_infer_like(("X", "X@GRAD")))
def _squared_l2_norm_grad(ctx) -> None:
    x, dout = ctx.input("X"), ctx.input("Out@GRAD")
    ctx.set_output("X@GRAD", x * (2.0 * dout.reshape(-1)[0]))
