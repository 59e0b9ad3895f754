"""One declaration per optimizer (``UpdateRule``): its update op, the optimizer class that
appends it, its name in a job spec, which of the op's slots are state updated in place
(per element, so they shard with the parameter) and which are one-element scalars, whether
its step takes whole-parameter norms, and its fused sweep. Everything that needs to know
an optimizer reads this table: the fused update step (compiler/fuse_optimizer.py), the job
spec (train/optim.py), tensor parallelism's whole-parameter norms (tp_passes) and sharding
(sharding_passes). The arithmetic is update_math's; the one-parameter kernels are
ops/optimizer.py's.

A sweep runs a fused step over ``spans`` (first, end, gradient) of the parameters laid end
to end (compiler/fuse_optimizer.py's ``_Flat``): ``sweep(fused, ctx, flat, spans)``.

Adding an optimizer: its class (ringflow/optimizer), its op's kernel (ops/optimizer.py,
update_math for the arithmetic) and its rule here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import update_math as um
from .optimizer import adam_decay, lamb_attrs, momentum_decay


@dataclass(frozen=True)
class UpdateRule:
    op: str                          # the update op type
    optimizer: str                   # its class in ringflow.optimizer
    spec_name: str                   # optimizer.type in a job spec
    state: tuple[str, ...]           # slots updated in place per element, Param first
    sweep: Callable
    pows: tuple[str, ...] = ()       # one-element slots (bias-correction powers)
    whole_norms: bool = False        # the step scales by norms of the whole parameter

    @property
    def state_slots(self) -> tuple[str, ...]:
        """The optimizer state of one parameter: what sharding splits over the ranks."""
        return (*self.state[1:], *self.pows)


def _lr(ctx) -> float:
    return float(ctx.input("LearningRate").reshape(-1)[0])


def sweep_sgd(fused, ctx, flat, spans) -> None:
    lr = _lr(ctx)
    for lo, hi, g in spans:
        um.sgd(flat.part("Param", lo, hi), g, lr)


def sweep_momentum(fused, ctx, flat, spans) -> None:
    lr, mu = _lr(ctx), float(ctx.attr("mu"))
    nesterov, decay = bool(ctx.attr("use_nesterov")), momentum_decay(ctx.attr)
    for lo, hi, g in spans:
        um.momentum(flat.part("Param", lo, hi), flat.part("Velocity", lo, hi), g, lr, mu,
                    nesterov, decay)


def sweep_adam(fused, ctx, flat, spans) -> None:
    decay, ratio = adam_decay(fused.type, ctx.attr)
    lr = _lr(ctx) * ratio
    b1, b2, eps = (float(ctx.attr(k)) for k in ("beta1", "beta2", "epsilon"))
    keep = 1.0 - lr * decay if decay else None
    pows = _pows(ctx)
    for lo, hi, g in spans:
        # one sweep when the parameters of the span are at the same step (they are,
        # unless some joined the optimizer later)
        pieces = [(lo, hi, g)] if len({pows[flat.order[k]] for k in range(lo, hi)}) == 1 \
            else [(k, k + 1, flat.grad_of(g, lo, k)) for k in range(lo, hi)]
        for a, b, gg in pieces:
            lr_t, eps_t = um.adam_scalars(lr, *pows[flat.order[a]], eps)
            um.adam(flat.part("Param", a, b), flat.part("Moment1", a, b),
                    flat.part("Moment2", a, b), gg, b1, b2, lr_t, eps_t, keep)
    _step_pows(ctx, b1, b2)


def sweep_lamb(fused, ctx, flat, spans) -> None:
    pows, sums, directions = _pows(ctx), [], []
    for lo, hi, g in spans:
        for k in range(lo, hi):
            i = flat.order[k]
            p = flat.part("Param", k, k + 1)
            r = um.lamb_buffer(fused.params[i], p.size, p.dtype)
            sums += um.lamb_direction(p, flat.part("Moment1", k, k + 1),
                                      flat.part("Moment2", k, k + 1), flat.grad_of(g, lo, k),
                                      r, *lamb_attrs(ctx.attr, *pows[i]))
            directions.append((p, r))
    sums = um.all_reduce_sums(int(ctx.attr("ring_id")), sums)
    lr = _lr(ctx)
    for j, (p, r) in enumerate(directions):
        um.lamb_apply(p, r, lr * um.lamb_trust(sums[2 * j], sums[2 * j + 1]))
    _step_pows(ctx, float(ctx.attr("beta1")), float(ctx.attr("beta2")))


def sweep_lars(fused, ctx, flat, spans) -> None:
    parts, sums = [], []
    for lo, hi, g in spans:
        for k in range(lo, hi):
            p, gg = flat.part("Param", k, k + 1), flat.grad_of(g, lo, k)
            parts.append((p, flat.part("Velocity", k, k + 1), gg))
            sums += [float(np.dot(p, p)), float(np.dot(gg, gg))]
    sums = um.all_reduce_sums(int(ctx.attr("ring_id")), sums)
    lr, mu = _lr(ctx), float(ctx.attr("mu"))
    coeff, wd = float(ctx.attr("lars_coeff")), float(ctx.attr("lars_weight_decay"))
    eps = float(ctx.attr("epsilon"))
    for j, (p, v, g) in enumerate(parts):
        local_lr = um.lars_local_lr(lr, coeff, wd, eps, sums[2 * j], sums[2 * j + 1])
        um.lars(p, v, g, local_lr, mu, wd)


def _pows(ctx) -> list[tuple[float, float]]:
    return [(float(b1.reshape(-1)[0]), float(b2.reshape(-1)[0]))
            for b1, b2 in zip(ctx.inputs("Beta1Pow"), ctx.inputs("Beta2Pow"))]


def _step_pows(ctx, b1: float, b2: float) -> None:
    ctx.set_outputs("Beta1PowOut", [a * b1 for a in ctx.inputs("Beta1Pow")])
    ctx.set_outputs("Beta2PowOut", [a * b2 for a in ctx.inputs("Beta2Pow")])


_ADAM_STATE, _ADAM_POWS = ("Param", "Moment1", "Moment2"), ("Beta1Pow", "Beta2Pow")
RULES: dict[str, UpdateRule] = {rule.op: rule for rule in (
    UpdateRule("sgd", "SGD", "sgd", ("Param",), sweep_sgd),
    UpdateRule("momentum", "Momentum", "momentum", ("Param", "Velocity"), sweep_momentum),
    UpdateRule("adam", "Adam", "adam", _ADAM_STATE, sweep_adam, _ADAM_POWS),
    UpdateRule("adamw", "AdamW", "adamw", _ADAM_STATE, sweep_adam, _ADAM_POWS),
    UpdateRule("lamb", "Lamb", "lamb", _ADAM_STATE, sweep_lamb, _ADAM_POWS, whole_norms=True),
    UpdateRule("lars_momentum", "Lars", "lars", ("Param", "Velocity"), sweep_lars,
               whole_norms=True),
)}


def by_spec_name() -> dict[str, UpdateRule]:
    return {rule.spec_name: rule for rule in RULES.values()}
