"""Parameter update ops (Paddle's names and slots): sgd, momentum, adam, adamw, lamb,
lars_momentum; and squared_l2_norm, the per-gradient piece of global-norm clipping.

Updates are in place: ``ParamOut`` is normally the ``Param`` variable itself, so the kernel
writes into the parameter's array (and the moments') chunk by chunk (``_chunked``) instead
of allocating new ones. Scalars (learning rate, beta powers) are one-element arrays.
"""

from __future__ import annotations

import math

import numpy as np

from ..framework.registry import make_grad_op, register_op
from ._chunked import for_each_chunk, scratch


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
    lr = _lr(ctx)
    p, g = _flat(_state(ctx, "Param", "ParamOut"), ctx.input("Grad"))

    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        np.multiply(g[s:e], lr, out=tmp)
        p[s:e] -= tmp

    for_each_chunk(p.size, body)


# momentum: v = mu v + g (+ l2 decay); p -= lr v, or lr (g + mu v) with Nesterov ------------
@register_op("momentum", inputs=["Param", "Grad", "Velocity", "LearningRate"],
             outputs=["ParamOut", "VelocityOut"],
             attrs={"mu": 0.9, "use_nesterov": False, "regularization_method": "",
                    "regularization_coeff": 0.0},
             infer_shape=_infer_like(("Param", "ParamOut"), ("Velocity", "VelocityOut")))
def _momentum(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Velocity")
    lr, mu, nesterov = _lr(ctx), float(ctx.attr("mu")), bool(ctx.attr("use_nesterov"))
    decay = float(ctx.attr("regularization_coeff") or 0.0)
    if ctx.attr("regularization_method") != "l2_decay":
        decay = 0.0
    p = _state(ctx, "Param", "ParamOut").reshape(-1)
    v = _state(ctx, "Velocity", "VelocityOut").reshape(-1)
    g = ctx.input("Grad").reshape(-1)

    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        if decay:
            np.multiply(p[s:e], decay, out=tmp)
            tmp += g[s:e]
        else:
            tmp[...] = g[s:e]
        v[s:e] *= mu
        v[s:e] += tmp                      # v = mu v + g
        if nesterov:                       # p -= lr g + lr mu v
            tmp *= lr
            p[s:e] -= tmp
            np.multiply(v[s:e], lr * mu, out=tmp)
        else:                              # p -= lr v
            np.multiply(v[s:e], lr, out=tmp)
        p[s:e] -= tmp

    for_each_chunk(p.size, body)


# adam / adamw ------------------------------------------------------------------------------
# Paddle's form, which equals torch's: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t),
# p -= lr_t m / (sqrt(v) + eps sqrt(1 - b2^t)); b1^t, b2^t are the Beta*Pow inputs.
def _adam_moments(m: np.ndarray, v: np.ndarray, g: np.ndarray, tmp: np.ndarray,
                  b1: float, b2: float) -> None:
    np.subtract(g, m, out=tmp)
    tmp *= 1.0 - b1
    m += tmp                               # m = b1 m + (1 - b1) g
    np.multiply(g, g, out=tmp)
    tmp -= v
    tmp *= 1.0 - b2
    v += tmp                               # v = b2 v + (1 - b2) g^2


def _adam_update(ctx, decay: float, lr_ratio: float = 1.0) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Moment1", "Moment2")
    lr = _lr(ctx) * lr_ratio
    b1, b2, eps = (float(ctx.attr(k)) for k in ("beta1", "beta2", "epsilon"))
    b1p, b2p = ctx.input("Beta1Pow"), ctx.input("Beta2Pow")
    bc2 = math.sqrt(1.0 - float(b2p.reshape(-1)[0]))
    lr_t = lr * bc2 / (1.0 - float(b1p.reshape(-1)[0]))
    eps_t = eps * bc2
    keep = 1.0 - lr * decay                # AdamW's decoupled decay: p *= 1 - lr coeff
    p, m, v = (_state(ctx, a, b).reshape(-1) for a, b in _MOMENT_PAIRS[:3])
    g = ctx.input("Grad").reshape(-1)

    def body(s: int, e: int) -> None:
        tmp, pc, mc, vc = scratch(e - s, p.dtype), p[s:e], m[s:e], v[s:e]
        _adam_moments(mc, vc, g[s:e], tmp, b1, b2)
        np.sqrt(vc, out=tmp)
        tmp += eps_t
        np.divide(mc, tmp, out=tmp)
        tmp *= lr_t
        if decay:
            pc *= keep
        pc -= tmp

    for_each_chunk(p.size, body)
    ctx.set_output("Beta1PowOut", b1p * b1)
    ctx.set_output("Beta2PowOut", b2p * b2)


@register_op("adam", inputs=_ADAM_IN, outputs=_ADAM_OUT,
             attrs={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
             infer_shape=_infer_like(*_MOMENT_PAIRS))
def _adam(ctx) -> None:
    _adam_update(ctx, 0.0)


@register_op("adamw", inputs=_ADAM_IN, outputs=_ADAM_OUT,
             attrs={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "coeff": 0.01,
                    "with_decay": True, "lr_ratio": 1.0},
             infer_shape=_infer_like(*_MOMENT_PAIRS))
def _adamw(ctx) -> None:
    decay = float(ctx.attr("coeff")) if ctx.attr("with_decay") else 0.0
    _adam_update(ctx, decay, float(ctx.attr("lr_ratio")))


# lamb: r = m_hat / (sqrt(v_hat) + eps) + wd p; p -= lr (|p| / |r|) r -----------------------
def _lamb_direction(ctx, p, m, v, g, r) -> tuple[float, float]:
    """Updates the moments, writes r and returns (|p|^2, |r|^2) accumulated in float64."""
    b1, b2, eps = (float(ctx.attr(k)) for k in ("beta1", "beta2", "epsilon"))
    wd = float(ctx.attr("weight_decay"))
    bc1 = 1.0 - float(ctx.input("Beta1Pow").reshape(-1)[0])
    bc2 = 1.0 - float(ctx.input("Beta2Pow").reshape(-1)[0])

    def body(s: int, e: int) -> tuple[float, float]:
        tmp, rr = scratch(e - s, p.dtype), r[s:e]
        _adam_moments(m[s:e], v[s:e], g[s:e], tmp, b1, b2)
        np.divide(v[s:e], bc2, out=tmp)
        np.sqrt(tmp, out=tmp)
        tmp += eps
        np.divide(m[s:e], bc1, out=rr)
        rr /= tmp
        if wd:
            np.multiply(p[s:e], wd, out=tmp)
            rr += tmp
        return float(np.dot(p[s:e], p[s:e])), float(np.dot(rr, rr))

    parts = for_each_chunk(p.size, body)
    return math.fsum(a for a, _ in parts), math.fsum(b for _, b in parts)


_lamb_buffers: dict[tuple, np.ndarray] = {}


def _whole_sums(ctx, *partials: float) -> tuple[float, ...]:
    """Sums of squares of the whole parameter: a tensor-parallel shard's update op carries
    the model-parallel ``ring_id`` (-1: not sharded), over which its partial sums add up."""
    ring_id = int(ctx.attr("ring_id"))
    if ring_id < 0:
        return partials
    from ..distributed.collective.registry import get_ring

    sums = np.array(partials, dtype=np.float64)
    get_ring(ring_id).all_reduce(sums)
    return tuple(float(v) for v in sums)


@register_op("lamb", inputs=_ADAM_IN, outputs=_ADAM_OUT,
             attrs={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6, "weight_decay": 0.01,
                    "ring_id": -1},
             infer_shape=_infer_like(*_MOMENT_PAIRS))
def _lamb(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Moment1", "Moment2")
    lr = _lr(ctx)
    p, m, v = (_state(ctx, a, b).reshape(-1) for a, b in _MOMENT_PAIRS[:3])
    g = ctx.input("Grad").reshape(-1)
    key = (ctx.op.inputs["Param"][0], p.size, p.dtype.str)
    r = _lamb_buffers.get(key)
    if r is None:
        r = _lamb_buffers[key] = np.empty(p.size, p.dtype)
    p_sq, r_sq = _whole_sums(ctx, *_lamb_direction(ctx, p, m, v, g, r))
    trust = math.sqrt(p_sq) / math.sqrt(r_sq) if p_sq > 0 and r_sq > 0 else 1.0
    step = lr * trust

    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        np.multiply(r[s:e], step, out=tmp)
        p[s:e] -= tmp

    for_each_chunk(p.size, body)
    ctx.set_output("Beta1PowOut", ctx.input("Beta1Pow") * float(ctx.attr("beta1")))
    ctx.set_output("Beta2PowOut", ctx.input("Beta2Pow") * float(ctx.attr("beta2")))


# lars_momentum: local_lr = lr c |p| / (|g| + wd |p| + eps); v = mu v + local_lr (g + wd p);
# p -= v. With |p| or |g| zero (or wd zero), local_lr = lr, as Paddle's kernel.
@register_op("lars_momentum", inputs=["Param", "Grad", "Velocity", "LearningRate"],
             outputs=["ParamOut", "VelocityOut"],
             attrs={"mu": 0.9, "lars_coeff": 0.001, "lars_weight_decay": 0.0005,
                    "epsilon": 0.0, "ring_id": -1},
             infer_shape=_infer_like(("Param", "ParamOut"), ("Velocity", "VelocityOut")))
def _lars_momentum(ctx) -> None:
    _check_same_shape(ctx, "Param", "Grad", "Velocity")
    lr, mu = _lr(ctx), float(ctx.attr("mu"))
    coeff, wd = float(ctx.attr("lars_coeff")), float(ctx.attr("lars_weight_decay"))
    p = _state(ctx, "Param", "ParamOut").reshape(-1)
    v = _state(ctx, "Velocity", "VelocityOut").reshape(-1)
    g = ctx.input("Grad").reshape(-1)
    p_sq, g_sq = _whole_sums(ctx, float(np.dot(p, p)), float(np.dot(g, g)))
    p_norm, g_norm = math.sqrt(p_sq), math.sqrt(g_sq)
    local_lr = lr
    if wd > 0 and p_norm > 0 and g_norm > 0:
        local_lr = lr * coeff * p_norm / (g_norm + wd * p_norm + float(ctx.attr("epsilon")))

    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        np.multiply(p[s:e], wd, out=tmp)
        tmp += g[s:e]
        tmp *= local_lr
        v[s:e] *= mu
        v[s:e] += tmp
        p[s:e] -= v[s:e]

    for_each_chunk(p.size, body)


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
