"""Which rank of a sharding group updates which parameter: a pure function of the
parameters' bytes, in the order their gradients are reduced.

Parameters are never split: each goes whole to one owner, so an update op, its optimizer
state and its checkpoint entries stay those of one parameter, and Lamb's and LARS's
per-parameter norms need no communication. Owners are contiguous runs of that order
(rank 0 first), so a gradient bucket's reduction is one reduce-scatter and the parameters'
one all-gather, each rank's part a single range. Among such assignments the one with the
smallest largest shard is chosen (by bytes, not parameter count); of those, each rank
takes about its fair share of what is left, so no rank is left empty that need not be.
The largest shard is then at most total / n + the largest parameter: the "one
parameter's slack" of a sharded optimizer state.
"""

from __future__ import annotations

from collections.abc import Sequence


def _parts_needed(weights: Sequence[int], cap: int) -> int:
    """How many contiguous parts of at most ``cap`` the weights need (greedy, optimal)."""
    parts, current = 1, 0
    for w in weights:
        if current + w > cap:
            parts, current = parts + 1, 0
        current += w
    return parts


def min_max_shard(weights: Sequence[int], nranks: int) -> int:
    """The smallest possible largest shard of ``weights`` cut into ``nranks`` contiguous
    parts (binary search over the cap)."""
    lo, hi = max(weights, default=0), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if _parts_needed(weights, mid) <= nranks:
            hi = mid
        else:
            lo = mid + 1
    return lo


def shard_owners(weights: Sequence[int], nranks: int) -> list[int]:
    """The owner (0 .. nranks-1, non-decreasing) of each weight."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    weights = [int(w) for w in weights]
    if any(w < 0 for w in weights):
        raise ValueError(f"weights must be >= 0, got {weights}")
    cap = min_max_shard(weights, nranks)
    owners: list[int] = []
    i = 0
    for rank in range(nranks):
        left = nranks - rank
        fair = sum(weights[i:]) / left
        current = 0
        while i < len(weights):
            w = weights[i]
            rest = weights[i + 1:]
            must = left == 1 or _parts_needed(weights[i:], cap) > left - 1
            fits = current + w <= cap
            if not fits or (current and not must and current + w / 2 > fair):
                break
            current += w
            owners.append(rank)
            i += 1
            if not rest:
                break
    return owners


def shard_bounds(sizes: Sequence[int], owners: Sequence[int], nranks: int) -> list[int]:
    """nranks + 1 offsets into the values laid end to end (``sizes`` in that order): rank
    r's part is [bounds[r], bounds[r+1]). ``owners`` must be non-decreasing."""
    bounds = [0] * (nranks + 1)
    at = 0
    for size, owner in zip(sizes, owners):
        at += int(size)
        for r in range(owner + 1, nranks + 1):
            bounds[r] = at
    return bounds
