"""TPTrainOperator on text with validation, then TPEvaluateOperator on its checkpoint, with
real launcher, rank and evaluate/generate processes on this host (``execute()`` in-process
with a minimal context, as test_tp_train_operator.py does): the training summary (XCom)
and Asset event keep the validation loss and the best checkpoint; the evaluate task returns
the job's last validation loss, the perplexity and generated text, and fails without retry
when its gate (``fail_if``) is met or its arguments are refused."""

from __future__ import annotations

import math
import uuid

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException

from ringflow_provider.exceptions import (
    RingflowConfigException,
    RingflowJobRefusedException,
    RingflowMetricGateException,
)
from ringflow_provider.operators.tp_evaluate import TPEvaluateOperator
from ringflow_provider.operators.tp_train import TPTrainOperator
from tests.provider.conftest import REPO, wait_until
from tests.provider.test_poprun_operator import RecordingLog
from tests.provider.test_tp_train_operator import Events, ctx, log_text, marked

pytestmark = [pytest.mark.multiproc]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(summary, Asset event extra, training log, tmp folder) of one text job: mp 2, the
    repository's models as the corpus, char tokenizer, a tenth held out."""
    tmp = tmp_path_factory.mktemp("evaluate")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for name in ("transformer.py", "mlp.py"):
        (corpus / name).write_text((REPO / "provider/ringflow/models" / name).read_text())
    mark = uuid.uuid4().hex
    op = TPTrainOperator(
        task_id="train", model="transformer", dtype="float64", data=str(corpus),
        tokenizer="char", validation_fraction="0.1", eval_every="3",
        model_args={"vocab_size": 128, "seq_len": 16, "hidden_size": 16, "num_heads": 4,
                    "num_layers": 1, "ffn_size": 32},
        steps=6, log_every=3, global_batch_size=8, tensor_parallel_degree=2,
        nproc_per_host=2, checkpoint_dir=str(tmp / "ckpt"), checkpoint_every=3,
        optimizer={"type": "adam", "learning_rate": 0.01}, log_dir=str(tmp / "logs"),
        extra_env={"TP_TEST_MARK": mark, "PYTHONPATH": str(REPO)}, allow_unsafe_env=True)
    op._cached_logger = RecordingLog()
    asset = Asset("ringflow://tp_test/train")
    op.outlets = [asset]
    events = Events()
    summary = op.execute(ctx(events=events))
    wait_until(lambda: not marked(mark), 15, "the job's processes to end")
    return summary, events[asset].extra, log_text(op), tmp


def evaluator(**args) -> TPEvaluateOperator:
    op = TPEvaluateOperator(task_id="evaluate", **args)
    op._cached_logger = RecordingLog()
    return op


def test_the_training_summary_and_asset_event_keep_the_validation(trained):
    summary, extra, log, tmp = trained
    assert [s for s, _ in summary["val_loss_history"]] == [3, 6]
    assert summary["val_loss"] == summary["val_loss_history"][-1][1]
    assert summary["best_checkpoint"] == str(tmp / "ckpt" / "step-00000006")
    assert summary["best_val_loss"] == summary["val_loss"] < math.log(128)
    assert extra["val_loss"] == summary["val_loss"]
    assert extra["best_checkpoint"] == summary["best_checkpoint"]
    assert "step 6/6  loss " in log and f"val_loss {summary['val_loss']:.4f}" in log


def test_evaluate_returns_the_jobs_validation_loss_and_generated_text(trained):
    summary, _, _, _ = trained
    op = evaluator(checkpoint=summary["checkpoint"], prompt="def ", max_new_tokens="30",
                   seed="2", top_k="8", fail_if={"val_loss": {"gt": 100.0}})
    result = op.execute(ctx())
    assert result["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-10, abs=0)
    assert result["perplexity"] == pytest.approx(math.exp(result["val_loss"]), rel=1e-12)
    assert result["step"] == 6 and result["checkpoint"] == summary["checkpoint"]
    assert isinstance(result["generated"], str) and len(result["generated"]) == 30
    assert result["prompt"] == "def "
    assert f"def {result['generated']}" in log_text(op)
    again = evaluator(checkpoint=summary["checkpoint"], prompt="def ", max_new_tokens=30,
                      seed=2, top_k=8).execute(ctx())
    assert again["generated"] == result["generated"]


def test_a_met_gate_fails_the_task_without_retry_naming_the_metric(trained):
    summary, _, _, _ = trained
    op = evaluator(checkpoint=summary["checkpoint"], fail_if='{"val_loss": {"gt": 0.5}}')
    with pytest.raises(RingflowMetricGateException, match=r"misses its gate: val_loss "
                       r"[\d.]+ > 0\.5") as err:
        op.execute(ctx())
    assert isinstance(err.value, AirflowFailException)
    missing = evaluator(checkpoint=summary["checkpoint"], fail_if={"accuracy": {"lt": 0.9}})
    with pytest.raises(RingflowMetricGateException, match="accuracy is None, not a finite"):
        missing.execute(ctx())


@pytest.mark.parametrize("args, message", [
    ({"fail_if": {"val_loss": {"above": 1}}}, "fail_if.val_loss.above"),
    ({"max_new_tokens": -1}, "max_new_tokens: Input should be greater than or equal to 0"),
    ({"checkpoint": ""}, "checkpoint: String should have at least 1 character"),
])
def test_refused_arguments_fail_before_anything_runs(trained, args, message):
    summary, _, _, _ = trained
    op = evaluator(**{"checkpoint": summary["checkpoint"], **args})
    with pytest.raises(RingflowConfigException, match=message):
        op.execute(ctx())


def test_a_checkpoint_that_is_not_there_fails_without_retry(trained):
    _, _, _, tmp = trained
    with pytest.raises(RingflowJobRefusedException, match=r"ringflow evaluate failed \(exit "
                       r"code 2\): python -m ringflow.evaluate: error: checkpoint .*nowhere: "
                       r"no such folder"):
        evaluator(checkpoint=str(tmp / "nowhere")).execute(ctx())
