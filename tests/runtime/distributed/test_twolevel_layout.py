"""Which rings all-reduce in two levels (twolevel.layout_for, a pure function of the ranks'
addresses in ring order); the algorithm itself runs in test_collectives_matrix.py
("two-hosts", 4 ranks) and in the failure tests."""

from __future__ import annotations

import pytest

from ringflow.distributed.collective.twolevel import Layout, layout_for

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


@pytest.mark.parametrize("ips", [
    [A, A, A],            # one host: shared memory throughout
    [A, B],               # one rank per host: the TCP ring is already one level
    [A, B, C],
    [A, A, B],            # uneven hosts
    [A, A, B, B, B, B],
    [A, B, A, B],         # a host's ranks not contiguous (not host-major)
    [],
])
def test_rings_that_are_not_hosts_times_ranks_stay_flat(ips):
    assert all(layout_for(ips, pos) is None for pos in range(len(ips)))


def test_two_hosts_of_two_ranks():
    ips = [A, A, B, B]
    assert [layout_for(ips, p) for p in range(4)] == [
        Layout(2, 2, 0, 0), Layout(2, 2, 0, 1), Layout(2, 2, 1, 0), Layout(2, 2, 1, 1)]


def test_three_hosts_of_three_ranks_name_their_host_and_cross_rings():
    ips = [A] * 3 + [B] * 3 + [C] * 3
    lay = layout_for(ips, 5)
    assert lay == Layout(hosts=3, per_host=3, host=1, local=2)
    assert lay.local_positions() == [3, 4, 5]
    assert lay.cross_positions() == [2, 5, 8]
