"""benchmarks/scaling_model.py: the alpha-beta model's pure functions, on made-up
calibrations whose answers can be worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import scaling_model as sm

SHM, SHM4 = sm.Link(10e-6, 10e9), sm.Link(60e-6, 4e9)
NET = sm.Link(20e-6, 1e9)


def cal(params: int, links: dict | None = None) -> sm.Calibration:
    return sm.Calibration("X", params, 64, {(64, 2, 1): 100.0, (32, 1, 2): 60.0,
                                           (16, 1, 4): 40.0}, 1.0,
                          links or {"shm": SHM, "tcp": NET, "net": NET, "shm4": SHM4})


def test_fit_link_recovers_alpha_and_beta_of_a_line():
    alpha, beta = 30e-6, 2e9
    points = [(n, 3 * alpha + 1.5 * n / beta) for n in (1 << 20, 4 << 20, 16 << 20)]
    link = sm.fit_link(points, 3, 1.5)
    assert link.alpha == pytest.approx(alpha) and link.beta == pytest.approx(beta)


def test_a_ring_and_the_in_place_algorithm_cost_what_their_forms_say():
    assert SHM.ring(2, 8e6) == pytest.approx(2 * (10e-6 + 0.5 * 8e6 / 10e9))
    assert SHM.in_place(2, 8e6) == pytest.approx(3 * 10e-6 + 2 * 0.5 * 8e6 / 10e9)
    assert SHM.ring(1, 8e6) == 0.0


def test_more_ranks_than_cores_slow_the_link_between_hosts_as_they_slowed_shared_memory():
    """2 + 2 ranks on the calibration's 2 cores: the hosts' ring runs on a link whose
    hand-off costs 50 us more and whose bytes move 2.5x slower (shm -> shm4)."""
    crowded = sm.comm_seconds(cal(1_000_000), sm.Layout(2, 2))
    without = sm.comm_seconds(cal(1_000_000, {"shm": SHM, "tcp": NET, "net": NET}),
                              sm.Layout(2, 2))
    nbytes = 4e6
    slow = sm.Link(NET.alpha + 50e-6, NET.beta * 0.4 / 2)   # shared by the host's 2 ranks
    assert crowded == pytest.approx(2 * SHM4.in_place(2, nbytes, 1) + slow.ring(2, nbytes / 2))
    assert without == pytest.approx(2 * SHM.in_place(2, nbytes, 1)
                                    + sm.Link(NET.alpha, NET.beta / 2).ring(2, nbytes / 2))
    assert crowded > 2 * without


def test_stage_2_pays_a_staging_copy_only_with_more_than_one_bucket():
    small, big = cal(4_000_000), cal(40_000_000)   # 16 MB and 160 MB of float32 gradients
    for c in (small, big):
        one, two = (sm.step_parts(c, sm.Layout(1, 2, stage)) for stage in (1, 2))
        extra = two["update"] - one["update"]
        want = 0.0 if c is small else 2 / 7 * c.params * 2 * c.upd_ns * 1e-9
        assert extra == pytest.approx(want)
        assert (two["compute"], two["comm"]) == (one["compute"], one["comm"])


def test_sharding_across_hosts_goes_in_two_levels_with_several_ranks_per_host():
    """2 hosts x 2 ranks, even parts (no sizes: 1/4 each): per half, one host-level pass
    (2 hand-offs; each local rank handles half the buffer: its parts on both hosts) and a
    ring of the 2 hosts whose link the host's 2 rings share; 1 rank per host: one flat ring
    of the hosts."""
    c = cal(1_000_000, {"shm": SHM, "tcp": NET, "net": NET})
    nbytes = 4e6
    host = 2 * SHM.alpha + 1 * 0.5 * nbytes / SHM.beta
    cross = NET.alpha + 0.25 * nbytes / (NET.beta / 2)
    assert sm.comm_seconds(c, sm.Layout(2, 2, 1)) == pytest.approx(2 * (host + cross))
    assert sm.comm_seconds(c, sm.Layout(2, 1, 1)) == pytest.approx(2 * NET.ring(2, nbytes, 1))
    # the flat ring of all 4 ranks that it replaces: 3 steps of the slowest hop per half
    flat = 2 * NET.ring(4, nbytes, 1)
    assert sm.comm_seconds(c, sm.Layout(2, 2, 1)) < flat
    assert sm.two_level_halves(c, sm.Layout(2, 2, 1)) == pytest.approx(
        sm.comm_seconds(c, sm.Layout(2, 2, 1)))  # even parts either way here


def test_sharding_with_lopsided_parts_costs_two_all_reduces():
    """One parameter of 90 % at 2 x 2 ranks: the largest part (0.9 > 2/4 of the buffer)
    would hold up every step of a ring, so each half is an all-reduce of the buffer, as
    ring.lopsided decides in the collectives."""
    links = {"shm": SHM, "tcp": NET, "net": NET}
    even = cal(1_000_000, links)
    lop = sm.Calibration("X", 1_000_000, 64, even.fb_ms, 1.0, links,
                         sizes=(900_000, 50_000, 50_000))
    assert lop.share(4) == pytest.approx(0.9)
    plain = sm.comm_seconds(lop, sm.Layout(2, 2))
    assert sm.comm_seconds(lop, sm.Layout(2, 2, 1)) == pytest.approx(2 * plain)
    assert sm.comm_seconds(lop, sm.Layout(2, 2, 1)) < sm.sharded_two_level(
        SHM, NET, sm.Layout(2, 2, 1), 4e6, 0.9)
