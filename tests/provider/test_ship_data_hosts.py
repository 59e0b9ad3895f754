"""``ship_data=True`` on hosts that are real hosts (tests/hosts.py: own /tmp and home, so a
path of the worker does not exist there): a text corpus of the worker trains on two hosts,
uploaded once, checked by its digest on each host and reused by the next job (a copy changed
on a host is replaced); and TPEvaluateOperator with ``host`` evaluates the checkpoint on the
first host, the runtime shipped, giving the job's validation loss."""

from __future__ import annotations

import uuid

import pytest

from ringflow_provider.operators.tp_evaluate import TPEvaluateOperator
from tests.provider.conftest import REPO
from tests.provider.test_poprun_operator import RecordingLog
from tests.provider.test_tp_train_hosts import (
    ctx,
    log_text,
    make,
    two_hosts,  # noqa: F401 (the fixture)
)

pytestmark = [pytest.mark.ssh, pytest.mark.multiproc, pytest.mark.slow]
TEXT = dict(model="transformer", model_args={"vocab_size": 128, "seq_len": 16,
                                             "hidden_size": 16, "num_heads": 4,
                                             "num_layers": 1, "ffn_size": 32},
            tokenizer="char", validation_fraction=0.1, eval_every=2, steps=4, log_every=2,
            checkpoint_every=2, ship_data=True)


def test_shipped_text_trains_on_two_hosts_once_and_evaluates_on_a_host(
        two_hosts, ns_hosts, tmp_path):  # noqa: F811 (the imported fixture)
    hosts, conns = two_hosts
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("transformer.py", "mlp.py"):
        (corpus / name).write_text((REPO / "provider/ringflow/models" / name).read_text())
    first = make(two_hosts, data=str(corpus), **TEXT)
    summary = first.execute(ctx(f"run-{uuid.uuid4().hex[:8]}"))
    text = log_text(first)
    for host in hosts:
        assert f"host {host}: data {corpus} uploaded 2 file(s) at ~/.ringflow/data/" in text
    assert [s for s, _ in summary["val_loss_history"]] == [2, 4]

    again = make(two_hosts, data=str(corpus), **TEXT)
    repeat = again.execute(ctx(f"run-{uuid.uuid4().hex[:8]}"))
    for host in hosts:
        assert f"host {host}: data {corpus} reused (digest checked)" in log_text(again)
    assert repeat["val_loss_history"] == summary["val_loss_history"]     # bitwise

    tamper = "for f in /root/.ringflow/data/*/corpus/mlp.py; do echo x >> \"$f\"; done"
    assert ns_hosts[1].run(["sh", "-c", tamper]).returncode == 0
    third = make(two_hosts, data=str(corpus), **TEXT)
    assert third.execute(ctx(f"run-{uuid.uuid4().hex[:8]}"))["val_loss_history"] == \
        summary["val_loss_history"]
    assert f"host {hosts[1]}: data {corpus} uploaded 2 file(s)" in log_text(third)
    assert f"host {hosts[0]}: data {corpus} reused" in log_text(third)

    op = TPEvaluateOperator(task_id="evaluate", checkpoint=summary["checkpoint"],
                            host=hosts[0], ssh_conn_id=conns[hosts[0]],
                            python="/usr/bin/python3", prompt="def ", max_new_tokens=20)
    op._cached_logger = RecordingLog()
    result = op.execute(ctx("evaluate"))
    assert result["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-10, abs=0)
    assert result["checkpoint"] == summary["checkpoint"] and len(result["generated"]) == 20
