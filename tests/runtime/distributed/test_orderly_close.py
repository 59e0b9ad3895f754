"""The pieces of an orderly close on the shared-memory side: a peer that left in order is named
as having left early only while a wait it should meet is unmet; a wait it met before leaving
still completes; a peer gone without goodbye is dead."""

from __future__ import annotations

import numpy as np
import pytest

from ringflow.distributed.collective.transport import shm
from ringflow.distributed.collective.transport.base import Deadline, OpContext, spin_wait
from ringflow.errors import CommError

CTX = OpContext(rank=1, ring_id=7, op="all_reduce")
GONE_PID = 2**22 + 12345  # above the default pid_max: no such process


def test_a_wait_met_by_a_peer_before_it_left_completes():
    flags = {"ready": False}

    def check() -> None:  # the peer's exit is noticed first, its last post is visible too
        flags["ready"] = True
        raise CTX.error(2, "rank 2 (pid 1) died")

    spin_wait(lambda: flags["ready"], Deadline(5), check, lambda: "x", CTX, lambda: 2)
    assert flags["ready"]


def test_an_unmet_wait_on_a_peer_that_left_in_order_names_it_as_left_early():
    words = np.zeros(8, dtype=np.int64)
    watch = shm.PeerWatch({2: GONE_PID}, CTX, 5.0, {2: (memoryview(words), shm.LEFT)})
    words[shm.LEFT] = 1
    with pytest.raises(CommError) as err:
        spin_wait(lambda: False, Deadline(5), watch.check, lambda: "x", CTX, lambda: 2)
    assert str(err.value).startswith("rank 1: all_reduce on ring 7 failed with peer rank 2: "
                                     "rank 2 left early: it finished and closed this ring")


def test_a_peer_gone_without_goodbye_is_dead():
    words = np.zeros(8, dtype=np.int64)
    watch = shm.PeerWatch({2: GONE_PID}, CTX, 5.0, {2: (memoryview(words), shm.LEFT)})
    with pytest.raises(CommError, match=f"peer rank 2: rank 2 \\(pid {GONE_PID}\\) died"):
        watch.check()
