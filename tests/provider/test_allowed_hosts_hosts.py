"""``allowed_hosts`` on hosts that are real hosts (tests/hosts.py): a TPTrainOperator job
naming a host its connection does not allow is refused before any SSH connection is made, to
that host or any other (every link captured with tcpdump), and the same connection runs a job
on the host it allows."""

from __future__ import annotations

import json

import pytest

from ringflow_provider.exceptions import RingflowHostNotAllowedException
from ringflow_provider.operators.tp_train import TPTrainOperator
from tests.provider.contexts import TaskInstanceStub
from tests.provider.test_poprun_operator import RecordingLog
from tests.secret_watch import Capture

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]
CONN = "ringflow_allow_ns"
SSH_PORT = 22


def train(hosts: list[str], **overrides) -> TPTrainOperator:
    op = TPTrainOperator(task_id="train", hosts=hosts, ssh_conn_id=CONN,
                         python="/usr/bin/python3", model="mlp",
                         model_args={"input_size": 4, "hidden_size": 8, "num_classes": 2},
                         steps=3, log_every=1, global_batch_size=2, nproc_per_host=1,
                         tensor_parallel_degree=1, checkpoint_dir=None, **overrides)
    op._cached_logger = RecordingLog()
    return op


def ssh_links(capture: Capture, address: str) -> list[tuple]:
    return [key for key in capture.streams()
            if (key[3], key[4]) == (address, SSH_PORT) or (key[1], key[2]) == (address,
                                                                                SSH_PORT)]


def test_a_host_outside_allowed_hosts_is_never_connected_and_an_allowed_one_runs(
        ns_hosts, monkeypatch, tmp_path):
    allowed, other = ns_hosts[0], ns_hosts[2]
    conn = allowed.connection()  # its host key pinned: only `allowed` is ever reached
    conn["extra"]["allowed_hosts"] = [allowed.address]
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps(conn))

    with Capture([allowed.veth, other.veth], tmp_path) as capture:
        with pytest.raises(RingflowHostNotAllowedException) as caught:
            train([allowed.address, other.address]).execute(
                {"ti": TaskInstanceStub("allow_ns", "train")})
        refused_links = ssh_links(capture, other.address) + ssh_links(capture, allowed.address)
        result = train([allowed.address]).execute(
            {"ti": TaskInstanceStub("allow_ns", "train")})

    assert str(caught.value).startswith(
        f"host {other.address!r} is not allowed by ssh connection {CONN!r}: its extra "
        f"allowed_hosts is {json.dumps([allowed.address])}")
    assert refused_links == []           # no SSH to any host of the refused job
    assert ssh_links(capture, other.address) == []
    assert ssh_links(capture, allowed.address)  # the capture sees the allowed job's SSH
    assert result["steps"] == 3 and result["world_size"] == 1
    assert other.leftovers() == [] and not (other.home / ".ringflow").exists()
