"""An `ssh` connection's ``allowed_hosts`` extra (ringflow_provider.hooks.allowed_hosts): what
it allows, and that every path that reaches hosts refuses, before connecting, a host outside
it: the hook, both operators with each remote launcher (and PopRun's launch host), and the
deferrable trigger. The refused host here is a listening socket that counts connections (an
SSH client would connect to it first); the namespace hosts' test is test_allowed_hosts_hosts.py.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from airflow.sdk.exceptions import AirflowFailException

from ringflow_provider.exceptions import RingflowConfigException, RingflowHostNotAllowedException
from ringflow_provider.hooks.allowed_hosts import AllowedHosts, HostNotAllowedError
from ringflow_provider.hooks.multi_ssh import MultiHostSSHHook
from ringflow_provider.launchers.job import JobHandle, Part, TaskKey
from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator
from ringflow_provider.triggers.job import JobTrigger
from tests.provider.contexts import TaskInstanceStub
from tests.provider.deferral import first_event, remake
from tests.provider.test_poprun_operator import RecordingLog

CONN = "ringflow_allow_test"
ALLOWED = ["10.77.9.*", "trainer-a"]


@pytest.mark.parametrize(("extra", "host", "allowed"), [
    ({}, "anything.example", True),                       # no extra: every host, as before
    ({"allowed_hosts": []}, "10.0.0.1", False),           # an empty list: none
    ({"allowed_hosts": ["trainer-a", "10.0.0.1"]}, "10.0.0.1", True),
    ({"allowed_hosts": ["trainer-a", "10.0.0.1"]}, "10.0.0.2", False),
    ({"allowed_hosts": ["Trainer-A"]}, "trainer-a", True),  # names: case-insensitive
    ({"allowed_hosts": "trainer-a, trainer-b"}, "trainer-b", True),  # a comma string
    ({"allowed_hosts": '["trainer-a"]'}, "trainer-a", True),  # JSON text of a list
    ({"allowed_hosts": ["10.77.0.*"]}, "10.77.0.5", True),
    ({"allowed_hosts": ["10.77.0.*"]}, "10.77.0.5.evil.example", False),  # label by label
    ({"allowed_hosts": ["10.77.0.*"]}, "10.77.1.5", False),
    ({"allowed_hosts": ["*.train.example"]}, "n1.train.example", True),
    ({"allowed_hosts": ["*.train.example"]}, "n1.evil.example", False),
    ({"allowed_hosts": ["trainer-?"]}, "trainer-b", True),
    ({"allowed_hosts": ["10.77.0.0/30"]}, "10.77.0.3", True),
    ({"allowed_hosts": ["10.77.0.0/30"]}, "10.77.0.4", False),
    ({"allowed_hosts": ["10.77.0.0/30"]}, "trainer-a", False),  # no DNS lookup
    ({"allowed_hosts": ["10.77.0.1"]}, "host-at-10-77-0-1", False),
])
def test_allowed_hosts_allows_names_patterns_by_label_and_networks(extra, host, allowed):
    assert AllowedHosts.of(CONN, extra).permits(host) is allowed


@pytest.mark.parametrize("value", [5, {"a": 1}, [1, 2], "[not json", ["10.0.0.0/33"]])
def test_an_unreadable_allowed_hosts_refuses_every_host_naming_the_connection(value):
    with pytest.raises(HostNotAllowedError, match=rf"ssh connection '{CONN}': its extra "
                                                  rf"allowed_hosts cannot be read"):
        AllowedHosts.of(CONN, {"allowed_hosts": value})


def test_the_refusal_names_the_host_the_connection_and_the_extra():
    with pytest.raises(HostNotAllowedError) as caught:
        AllowedHosts.of(CONN, {"allowed_hosts": ALLOWED}).check(
            ["trainer-a", "10.1.1.1"], CONN)
    assert str(caught.value).startswith(
        f"host '10.1.1.1' is not allowed by ssh connection '{CONN}': its extra allowed_hosts "
        f'is ["10.77.9.*", "trainer-a"]; nothing was started')


# -- every path that reaches hosts -----------------------------------------------------------
@pytest.fixture
def listener(monkeypatch):
    """A TCP listener on 127.0.0.1 (the refused host), the connection `CONN` pointing at its
    port with ALLOWED as its allowed_hosts; `accepted()` counts the connections it got."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    conn = {"conn_type": "ssh", "host": "10.77.9.1", "port": sock.getsockname()[1],
            "login": "nobody", "extra": {"allowed_hosts": ALLOWED, "no_host_key_check": "true"}}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps(conn))

    class Listener:
        @staticmethod
        def accepted() -> int:
            count = 0
            while True:
                try:
                    sock.accept()[0].close()
                except BlockingIOError:
                    return count
                count += 1

    yield Listener
    sock.close()


def context() -> dict:
    return {"ti": TaskInstanceStub("allow", "t")}


def test_the_hook_refuses_a_host_before_connecting(listener):
    hook = MultiHostSSHHook(CONN, conn_timeout=3)
    with pytest.raises(HostNotAllowedError, match=r"host '127\.0\.0\.1' is not allowed by "
                                                  rf"ssh connection '{CONN}'"):
        hook.connect("127.0.0.1")
    assert listener.accepted() == 0


@pytest.mark.parametrize("launcher", ["ssh", "mpirun"])
def test_tp_train_refuses_a_host_outside_allowed_hosts_without_retries(listener, launcher,
                                                                       tmp_path):
    op = TPTrainOperator(task_id="t", hosts=["10.77.9.1", "127.0.0.1"], ssh_conn_id=CONN,
                         launcher=launcher, model="mlp", steps=2, nproc_per_host=1,
                         global_batch_size=2, log_dir=str(tmp_path))
    op._cached_logger = RecordingLog()
    with pytest.raises(RingflowHostNotAllowedException) as caught:
        op.execute(context())
    assert isinstance(caught.value, (RingflowConfigException, AirflowFailException))
    assert f"host '127.0.0.1' is not allowed by ssh connection '{CONN}'" in str(caught.value)
    assert listener.accepted() == 0


@pytest.mark.parametrize(("hosts", "launch_host", "refused"), [
    ("10.77.9.1", "127.0.0.1", "127.0.0.1"),      # the launch host
    ("10.77.9.1,127.0.0.1", None, "127.0.0.1"),   # a host only poprun's mpirun reaches
])
def test_poprun_refuses_a_launch_host_or_host_outside_allowed_hosts(listener, hosts,
                                                                     launch_host, refused):
    op = PopRunOperator(task_id="t", hosts=hosts, nproc_per_host=1, ipus_per_replica=1,
                        num_ipus=len(hosts.split(",")), ipu_partition="p", vipu_server="v",
                        training_script="t.py", ssh_conn_id=CONN, launch_host=launch_host,
                        conn_timeout=3)
    op._cached_logger = RecordingLog()
    with pytest.raises(RingflowHostNotAllowedException,
                       match=rf"host '{refused}' is not allowed by ssh connection '{CONN}'"):
        op.execute(context())
    assert listener.accepted() == 0


def test_the_trigger_refuses_to_reconnect_to_a_host_outside_allowed_hosts(listener):
    """A deferred job whose connection no longer allows its host: the trigger never opens a
    connection to it, and the task fails without retries."""
    handle = JobHandle(launcher="ssh", job_id="j1", task=TaskKey("allow", "t", "r", 1),
                       hosts=("127.0.0.1",), parts=(Part("127.0.0.1", ".ringflow/j", CONN),),
                       python="python3")
    trigger = remake(JobTrigger(job=handle.to_dict(), poll_interval=0.1, reconnect_s=5))

    event = asyncio.run(first_event(trigger, 30)).payload

    assert event["status"] == "refused"
    assert f"host '127.0.0.1' is not allowed by ssh connection '{CONN}'" in event["message"]
    assert listener.accepted() == 0
    op = PopRunOperator(task_id="t", hosts="127.0.0.1", nproc_per_host=1, ipus_per_replica=1,
                        num_ipus=1, ipu_partition="p", vipu_server="v", training_script="t.py",
                        ssh_conn_id=CONN)
    with pytest.raises(RingflowHostNotAllowedException, match="is not allowed by"):
        op.execute_complete(context(), event)
