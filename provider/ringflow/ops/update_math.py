"""The arithmetic of the parameter updates over flat arrays, shared by the update ops
(ops/optimizer.py: one parameter per op) and the fused update step (compiler/
fuse_optimizer.py: many parameters laid end to end in one buffer). Both call these same
functions, so a fused update is bitwise the unfused one: every function is elementwise
(chunk boundaries do not change a value) except the sums of squares, which are taken per
parameter with the chunks starting at the parameter's first element.

Arrays are 1-D and updated in place, chunk by chunk (``_chunked``): about one pass over
main memory per array however many ufuncs a step takes.
"""

from __future__ import annotations

import math

import numpy as np

from ._chunked import for_each_chunk, scratch


def sgd(p: np.ndarray, g: np.ndarray, lr: float) -> None:
    """p -= lr g"""
    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        np.multiply(g[s:e], lr, out=tmp)
        p[s:e] -= tmp

    for_each_chunk(p.size, body)


def momentum(p: np.ndarray, v: np.ndarray, g: np.ndarray, lr: float, mu: float,
             nesterov: bool, decay: float) -> None:
    """v = mu v + g (+ decay p); p -= lr v, or lr (g + mu v) with Nesterov."""
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


def adam_moments(m: np.ndarray, v: np.ndarray, g: np.ndarray, tmp: np.ndarray,
                 b1: float, b2: float) -> None:
    np.subtract(g, m, out=tmp)
    tmp *= 1.0 - b1
    m += tmp                               # m = b1 m + (1 - b1) g
    np.multiply(g, g, out=tmp)
    tmp -= v
    tmp *= 1.0 - b2
    v += tmp                               # v = b2 v + (1 - b2) g^2


def adam_scalars(lr: float, b1_pow: float, b2_pow: float, eps: float) -> tuple[float, float]:
    """(lr_t, eps_t) of Paddle's form, which equals torch's:
    lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), eps_t = eps sqrt(1 - b2^t)."""
    bc2 = math.sqrt(1.0 - b2_pow)
    return lr * bc2 / (1.0 - b1_pow), eps * bc2


def adam(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, b1: float, b2: float,
         lr_t: float, eps_t: float, keep: float | None) -> None:
    """p -= lr_t m / (sqrt(v) + eps_t) after the moment updates; ``keep`` (AdamW's
    decoupled decay, 1 - lr coeff) multiplies p first when it is not None."""
    def body(s: int, e: int) -> None:
        tmp, pc, mc, vc = scratch(e - s, p.dtype), p[s:e], m[s:e], v[s:e]
        adam_moments(mc, vc, g[s:e], tmp, b1, b2)
        np.sqrt(vc, out=tmp)
        tmp += eps_t
        np.divide(mc, tmp, out=tmp)
        tmp *= lr_t
        if keep is not None:
            pc *= keep
        pc -= tmp

    for_each_chunk(p.size, body)


def lamb_direction(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray,
                   r: np.ndarray, b1: float, b2: float, eps: float, wd: float,
                   bc1: float, bc2: float) -> tuple[float, float]:
    """Updates the moments, writes r = m_hat / (sqrt(v_hat) + eps) + wd p and returns
    (|p|^2, |r|^2) accumulated in float64."""
    def body(s: int, e: int) -> tuple[float, float]:
        tmp, rr = scratch(e - s, p.dtype), r[s:e]
        adam_moments(m[s:e], v[s:e], g[s:e], tmp, b1, b2)
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


def lamb_trust(p_sq: float, r_sq: float) -> float:
    return math.sqrt(p_sq) / math.sqrt(r_sq) if p_sq > 0 and r_sq > 0 else 1.0


def lamb_apply(p: np.ndarray, r: np.ndarray, step: float) -> None:
    """p -= step r"""
    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        np.multiply(r[s:e], step, out=tmp)
        p[s:e] -= tmp

    for_each_chunk(p.size, body)


_lamb_buffers: dict[tuple, np.ndarray] = {}


def lamb_buffer(name: str, size: int, dtype: np.dtype) -> np.ndarray:
    """The direction buffer of parameter ``name`` (kept between steps: no page faults)."""
    key = (name, size, np.dtype(dtype).str)
    r = _lamb_buffers.get(key)
    if r is None:
        r = _lamb_buffers[key] = np.empty(size, dtype)
    return r


def lars_local_lr(lr: float, coeff: float, wd: float, eps: float, p_sq: float,
                  g_sq: float) -> float:
    """lr c |p| / (|g| + wd |p| + eps); lr when |p|, |g| or wd is zero, as Paddle's kernel."""
    p_norm, g_norm = math.sqrt(p_sq), math.sqrt(g_sq)
    if wd > 0 and p_norm > 0 and g_norm > 0:
        return lr * coeff * p_norm / (g_norm + wd * p_norm + eps)
    return lr


def lars(p: np.ndarray, v: np.ndarray, g: np.ndarray, local_lr: float, mu: float,
         wd: float) -> None:
    """v = mu v + local_lr (g + wd p); p -= v"""
    def body(s: int, e: int) -> None:
        tmp = scratch(e - s, p.dtype)
        np.multiply(p[s:e], wd, out=tmp)
        tmp += g[s:e]
        tmp *= local_lr
        v[s:e] *= mu
        v[s:e] += tmp
        p[s:e] -= v[s:e]

    for_each_chunk(p.size, body)


def all_reduce_sums(ring_id: int, partials: list[float]) -> list[float]:
    """Sums of squares of whole parameters: a tensor-parallel shard's update carries the
    model-parallel ``ring_id`` (-1: not sharded), over which its partial sums add up. One
    all-reduce for any number of them."""
    if ring_id < 0:
        return partials
    from ..distributed.collective.registry import get_ring

    sums = np.array(partials, dtype=np.float64)
    get_ring(ring_id).all_reduce(sums)
    return [float(v) for v in sums]
