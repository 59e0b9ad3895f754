"""A rank that finishes its last collective and exits (or destroys its group) says goodbye:
a neighbour still finishing its own part must not take that for a death; only using the
departed rank afterwards fails, naming it."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]
ROUNDS = 5


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_rank_leaving_after_its_last_op_does_not_fail_a_slower_neighbour(spawn, transport):
    job = spawn("early_exit.py", 3, args=[str(ROUNDS)],
                env={"RINGFLOW_TRANSPORT": transport, "RINGFLOW_COMM_TIMEOUT": "30"})
    codes = job.wait(timeout=90)
    assert codes == [0, 0, 0], job.output()
    logs = [job.log(r) for r in range(3)]
    for r in range(3):
        assert f"{ROUNDS} early leaves survived" in logs[r], job.output()
        assert logs[r].rstrip().endswith("done"), job.output()
    # rank 1's send to rank 2, which had left in order, fails naming rank 2, its host and why
    assert ("failed with peer rank 2 on 127.0.0.1: rank 2 on 127.0.0.1 left early"
            in logs[1]), job.output()
    # rank 0 then waits for data that rank 2 never sent
    assert "late use: rank 0" in logs[0] and "peer rank 2" in logs[0], job.output()
    assert job.shm_segments() == []
