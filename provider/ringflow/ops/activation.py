"""Activations: relu, tanh, sigmoid, gelu (exact or tanh-approximated), exp, log.

Grad ops read the forward output where the derivative is a function of it (relu, tanh,
sigmoid, exp), as Paddle's do, so they need not keep the input.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..framework.registry import make_grad_op, register_op, same_shape_as
from ._shapes import like_inputs


def _unary(type: str, grad_reads: str):
    """Registers ``type`` (X -> Out) and declares its grad op ``<type>_grad``, which reads
    ``grad_reads`` ("X" or "Out") and Out@GRAD and writes X@GRAD."""
    fwd = {"X": ("fwd_inputs", ["X"]), "Out": ("fwd_outputs", ["Out"])}[grad_reads]
    return register_op(type, inputs=["X"], outputs=["Out"], infer_shape=same_shape_as(),
                       grad=make_grad_op(f"{type}_grad", **{fwd[0]: fwd[1]}))


def _unary_grad(type: str, reads: str):
    return register_op(f"{type}_grad", inputs=[reads, "Out@GRAD"], outputs=["X@GRAD"],
                       infer_shape=like_inputs((reads, "X@GRAD")))


# relu: Out = max(X, 0); dX = dOut where Out > 0 -------------------------------------------
@_unary("relu", "Out")
def _relu(ctx) -> None:
    x = ctx.input("X")
    out = ctx.buffer("Out", x.shape, x.dtype)
    np.maximum(x, 0, out=out)
    ctx.set_output("Out", out)


@_unary_grad("relu", "Out")
def _relu_grad(ctx) -> None:
    out, dout = ctx.input("Out"), ctx.input("Out@GRAD")
    dx = ctx.buffer("X@GRAD", out.shape, dout.dtype)
    np.multiply(dout, out > 0, out=dx)
    ctx.set_output("X@GRAD", dx)


# tanh: dX = dOut (1 - Out^2) ---------------------------------------------------------------
@_unary("tanh", "Out")
def _tanh(ctx) -> None:
    x = ctx.input("X")
    out = ctx.buffer("Out", x.shape, x.dtype)
    np.tanh(x, out=out)
    ctx.set_output("Out", out)


@_unary_grad("tanh", "Out")
def _tanh_grad(ctx) -> None:
    out, dout = ctx.input("Out"), ctx.input("Out@GRAD")
    dx = ctx.buffer("X@GRAD", out.shape, dout.dtype)
    np.multiply(out, out, out=dx)
    np.subtract(1, dx, out=dx)
    dx *= dout
    ctx.set_output("X@GRAD", dx)


# sigmoid: Out = 1 / (1 + exp(-X)); dX = dOut Out (1 - Out) ---------------------------------
@_unary("sigmoid", "Out")
def _sigmoid(ctx) -> None:
    x = ctx.input("X")
    out = ctx.buffer("Out", x.shape, x.dtype)
    # exp of -|x| only: no overflow for large |x|
    np.negative(np.abs(x), out=out)
    np.exp(out, out=out)
    pos = x >= 0
    np.divide(np.where(pos, 1, out), out + 1, out=out)
    ctx.set_output("Out", out)


@_unary_grad("sigmoid", "Out")
def _sigmoid_grad(ctx) -> None:
    out, dout = ctx.input("Out"), ctx.input("Out@GRAD")
    dx = ctx.buffer("X@GRAD", out.shape, dout.dtype)
    np.subtract(1, out, out=dx)
    dx *= out
    dx *= dout
    ctx.set_output("X@GRAD", dx)


# exp, log ----------------------------------------------------------------------------------
@_unary("exp", "Out")
def _exp(ctx) -> None:
    ctx.set_output("Out", np.exp(ctx.input("X")))


@_unary_grad("exp", "Out")
def _exp_grad(ctx) -> None:
    ctx.set_output("X@GRAD", ctx.input("Out@GRAD") * ctx.input("Out"))


@_unary("log", "X")
def _log(ctx) -> None:
    ctx.set_output("Out", np.log(ctx.input("X")))


@_unary_grad("log", "X")
def _log_grad(ctx) -> None:
    ctx.set_output("X@GRAD", ctx.input("Out@GRAD") / ctx.input("X"))


# gelu ----------------------------------------------------------------------------------------
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# 1 / (2n+1)!! for the series of erf below
_SERIES = 1.0 / np.cumprod(np.arange(1.0, 200.0, 2.0))
# bands of |x| summed separately: small |x| needs far fewer terms
_BANDS = (0.0, 1.0, 2.0, 3.0)


def _series_terms(m: float) -> int:
    """Terms of the series at |x| <= m for a relative error below 1e-17."""
    term, n = 1.0, 0
    while term > 1e-17 or n < 2 * m * m:
        n += 1
        term *= 2 * m * m / (2 * n + 1)
    return n


def erf(x: np.ndarray) -> np.ndarray:
    """The error function to float64 precision (numpy has none): for |x| < 3 the series
    erf(x) = 2/sqrt(pi) exp(-x^2) x sum_n (2x^2)^n / (2n+1)!!, whose terms are all positive
    (no cancellation), by Horner's rule; beyond, erfc's continued fraction."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    result = np.ones_like(a)
    for lo, hi in itertools.pairwise(_BANDS):
        band = (a >= lo) & (a < hi)
        s = a[band]
        s2 = 2.0 * s * s
        n = _series_terms(hi)
        acc = np.full_like(s, _SERIES[n])
        for k in range(n - 1, -1, -1):
            acc *= s2
            acc += _SERIES[k]
        acc *= s
        s *= s
        np.negative(s, out=s)
        acc *= np.exp(s, out=s)
        result[band] = acc * (2.0 / math.sqrt(math.pi))
    mid = (a >= _BANDS[-1]) & (a < 6.5)    # erfc(6.5) < 1e-19: erf is 1 in float64 beyond
    m = a[mid]
    frac = m.copy()
    for k in range(60, 0, -1):  # erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + ...)))
        frac = m + (k / 2.0) / frac
    result[mid] = 1.0 - np.exp(-m * m) / math.sqrt(math.pi) / frac
    return np.copysign(result, x)


_GELU_K = 0.044715


def _gelu_parts(x: np.ndarray, approximate: bool) -> tuple[np.ndarray, np.ndarray]:
    """(Phi(x), dPhi/dx) of the exact Phi = (1 + erf(x / sqrt 2)) / 2, in float64 (numpy
    has no erf; ``erf`` sums a series)."""
    x = x.astype(np.float64)
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0))), np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _tanh_gelu(x: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """t = tanh(sqrt(2/pi) x (1 + k x^2)), in ``x2`` (which holds x^2 on entry) and in x's
    dtype: the tanh form is an approximation already, float64 would only cost passes."""
    x2 *= _GELU_K
    x2 += 1.0
    x2 *= x
    x2 *= _SQRT_2_OVER_PI
    return np.tanh(x2, out=x2)


@register_op("gelu", inputs=["X"], outputs=["Out"], attrs={"approximate": False},
             infer_shape=same_shape_as(), grad=make_grad_op("gelu_grad", fwd_inputs=["X"]))
def _gelu(ctx) -> None:
    x = ctx.input("X")
    if not ctx.attr("approximate"):
        phi, _ = _gelu_parts(x, False)
        ctx.set_output("Out", (x * phi).astype(x.dtype))
        return
    out = ctx.buffer("Out", x.shape, x.dtype)
    t = _tanh_gelu(x, np.multiply(x, x, out=out))
    t += 1.0                                # Out = x (1 + t) / 2
    t *= 0.5
    t *= x
    ctx.set_output("Out", t)


@register_op("gelu_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
             attrs={"approximate": False}, infer_shape=like_inputs(("X", "X@GRAD")))
def _gelu_grad(ctx) -> None:
    x, dout = ctx.input("X"), ctx.input("Out@GRAD")
    if not ctx.attr("approximate"):
        phi, dphi = _gelu_parts(x, False)
        ctx.set_output("X@GRAD", (dout * (phi + x * dphi)).astype(x.dtype))
        return
    # dOut/dx = (1 + t) / 2 + x (1 - t^2) / 2 * sqrt(2/pi) (1 + 3k x^2)
    x2 = np.multiply(x, x)
    t = _tanh_gelu(x, x2.copy())
    np.multiply(x2, 3 * _GELU_K, out=x2)
    x2 += 1.0
    x2 *= _SQRT_2_OVER_PI * 0.5
    x2 *= x                                 # x sqrt(2/pi) (1 + 3k x^2) / 2
    dx = ctx.buffer("X@GRAD", x.shape, dout.dtype)
    np.multiply(t, t, out=dx)
    np.subtract(1.0, dx, out=dx)
    dx *= x2                                # ... times (1 - t^2)
    t += 1.0
    t *= 0.5
    dx += t
    dx *= dout
    ctx.set_output("X@GRAD", dx)
