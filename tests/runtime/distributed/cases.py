"""The collective test matrix, shared by the workers (which run it) and the tests (which
check it): deterministic inputs per (case, rank) and the float64/int numpy reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("float16", "float32", "float64", "int32", "int64")
OPS = ("SUM", "MAX", "MIN", "PROD", "AVG")
# 0, 1, odd, not divisible by 2, 3 or 4, and larger than a segment (tests set 4 KiB segments)
COUNTS = (0, 1, 7, 1003, 6001)
# relative to the sum of absolute values (float16 carries 11 bits)
TOLERANCE = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-12}


@dataclass(frozen=True)
class Case:
    index: int
    dtype: str
    op: str
    count: int

    @property
    def key(self) -> str:
        return f"ar{self.index}_{self.dtype}_{self.op}_{self.count}"


def all_reduce_cases() -> list[Case]:
    cases = []
    for dtype in DTYPES:
        for op in OPS:
            if op == "AVG" and not dtype.startswith("float"):
                continue
            for count in COUNTS:
                cases.append(Case(len(cases), dtype, op, count))
    return cases


def make_input(case: Case, rank: int) -> np.ndarray:
    rng = np.random.default_rng([case.index, rank])
    if case.dtype.startswith("int"):
        low, high = (-3, 4) if case.op == "PROD" else (-1000, 1000)
        return rng.integers(low, high, size=case.count).astype(case.dtype)
    if case.op == "PROD":
        return rng.uniform(0.5, 1.5, size=case.count).astype(case.dtype)
    return rng.standard_normal(case.count).astype(case.dtype)


def reference(case: Case, nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(expected result, sum of absolute values) computed in float64 (ints: exactly)."""
    inputs = [make_input(case, r) for r in range(nranks)]
    wide = np.int64 if case.dtype.startswith("int") else np.float64
    stack = np.stack([x.astype(wide) for x in inputs]) if case.count else np.zeros((nranks, 0))
    ufunc = {"SUM": np.add, "AVG": np.add, "MAX": np.maximum, "MIN": np.minimum,
             "PROD": np.multiply}[case.op]
    expected = ufunc.reduce(stack, axis=0)
    if case.op == "AVG":
        expected = expected / nranks
    scale = np.abs(stack).sum(axis=0) if case.op in ("SUM", "AVG") else np.abs(expected)
    if case.op == "PROD":
        scale = np.abs(stack).prod(axis=0)
    if case.op == "AVG":
        scale = scale / nranks
    if case.dtype.startswith("int"):
        expected = expected.astype(case.dtype)  # wraps exactly like the workers' int arithmetic
    return expected, scale


# reduce_scatter: (result key, dtype, block shape, op); blocks larger than a segment included
RS_CASES = [("rs_f32_sum", "float32", (1003,), "SUM"), ("rs_f16_avg", "float16", (7,), "AVG"),
            ("rs_i64_empty", "int64", (0,), "SUM"), ("rs_f64_max_2d", "float64", (3, 5), "MAX")]


def rs_input(key: str, dtype: str, shape: tuple, rank: int, block: int) -> np.ndarray:
    """Rank `rank`'s contribution to block `block` (small integers: exact in every dtype)."""
    rng = np.random.default_rng([len(key), rank, block])
    return rng.integers(-50, 50, size=shape).astype(dtype)


# reduce_scatter_v / all_gather_v: uneven parts as sharding makes them. (key, dtype, count,
# how the count is cut): "even", "front" (all on rank 0), "back" (all on the last rank),
# "skewed" (rank r gets a share growing with r, some empty)
V_CASES = [(f"v_{dtype}_{count}_{cut}", dtype, count, cut)
           for dtype in ("float16", "float32", "float64", "int64")
           for count in (0, 1, 7, 1003, 6001)
           for cut in ("even", "front", "back", "skewed")]


def v_bounds(count: int, cut: str, nranks: int) -> list[int]:
    """nranks + 1 offsets: rank r's part is [bounds[r], bounds[r+1])."""
    if cut == "front":
        return [0] + [count] * nranks
    if cut == "back":
        return [0] * nranks + [count]
    weights = [1] * nranks if cut == "even" else [r * r for r in range(nranks)]
    total = sum(weights) or 1
    cuts, acc = [0], 0
    for w in weights:
        acc += w
        cuts.append(count * acc // total)
    cuts[-1] = count
    return cuts


def v_input(key: str, dtype: str, count: int, rank: int) -> np.ndarray:
    """Rank `rank`'s buffer (small integers: sums are exact in every dtype)."""
    rng = np.random.default_rng([len(key), count, rank])
    return rng.integers(-20, 20, size=count).astype(dtype)
