"""Train a small transformer language model on text, or an MLP, with tensor and data parallelism
on this Airflow worker's CPU, with ringflow's `TPTrainOperator`.

`nproc_per_host` worker processes (ranks) run the job: `tensor_parallel_degree` consecutive
ranks split every layer, the others are data-parallel replicas. The defaults train the
transformer character by character (`tokenizer="char"`) on `data/ringflow_corpus.txt`, a
corpus of this project's own text (its README and the training runtime's sources, 350,453
characters, 98 distinct) with 5 % held out for validation, with degree 2 on 2 ranks: in 600
steps (16 s on an idle 2-core machine) the validation loss falls to 2.89 nats per character
at step 100 and 1.85 at step 600, against the corpus's unigram entropy of 3.45 (what a model
that knows only how often each character occurs reaches). The MLP trains on its own
synthetic classification data.

What you get: a progress line every `log_every` steps in the task log (with the validation
loss every 100 steps), a summary in XCom (`final_loss`, `loss_history`, `val_loss`,
`best_checkpoint`, `samples_per_s`, the checkpoint, the log folder, the plot), a loss chart
at the end of the log and as `loss.png` in the log folder, and an event on the Asset
`ringflow://ringflow_tp_train/train` carrying the checkpoint and its validation loss, which
a downstream DAG can be scheduled on: `ringflow_tp_train_evaluate` below evaluates the model,
writes a few lines of text from it and fails when its validation loss is not good enough.

With the "Hosts" params set (`{"hosts": "trainer-a,trainer-b"}`), the same job runs on those
hosts over SSH (or Open MPI's mpirun) instead: `nproc_per_host` ranks on each, tensor
parallel inside a host, data parallel across; checkpoints on each host's disk. The corpus is
copied to each host over SFTP once (`ship_data`).

**Params reach the hosts**: whoever may trigger this DAG chooses where the job runs, with which
connection's credentials and interpreter. So the form offers only what you allow: the host
lists in the Airflow Variable `ringflow_tp_train_hosts` (a JSON list; a host list is a
comma-separated string or a list of names; read when this file is parsed; unset: none, the
job runs on this worker), the connections in `SSH_CONN_IDS` and the interpreters in `PYTHONS`
below; Airflow refuses a run whose conf names anything else:

    airflow variables set ringflow_tp_train_hosts '["trainer-a,trainer-b", ["gpu-1", "gpu-2"]]'

Give the connection an `allowed_hosts` extra too (`{"allowed_hosts": ["trainer-*"]}`): every
ringflow task refuses, before connecting, a host it does not list.

Trigger from the UI's form or with `airflow dags trigger ringflow_tp_train -c '{"steps":
50}'`; debug a change with `airflow tasks test ringflow_tp_train train -t '{"steps": 30}'`.
The job runs detached from the task under ringflow's supervisor: with `deferrable` the
triggerer watches it and the worker slot is free while it trains; a retry attaches to the
previous try's job if it still runs (`on_existing`), else resumes from its newest checkpoint
(under `~/.ringflow/checkpoints/`).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, task
from airflow.sdk.exceptions import AirflowSkipException

from ringflow_provider import tp_train
from ringflow_provider.operators.tp_evaluate import TPEvaluateOperator
from ringflow_provider.operators.tp_train import TPTrainOperator

JOB, LAYOUT, HOSTS, RUN = "Training job", "Layout", "Hosts", "Run"
#: the host lists the form offers (null: this Airflow worker), from the Variable
HOST_LISTS = [None, *tp_train.variable_choices("ringflow_tp_train_hosts")]
#: the ssh connections and the hosts' interpreters the form offers (the first: the default)
SSH_CONN_IDS = ["ssh_default"]
PYTHONS = ["python3"]
#: the transformer's text: checked in (scripts/demo_corpus.py writes it), so what the model
#: reaches on it does not move when the README or the sources change
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ringflow_corpus.txt")
#: the evaluate DAG's gate: a validation loss above this (nats per character) fails it; the
#: corpus's unigram entropy is 3.45, the default run reaches 1.85
MAX_VAL_LOSS = 2.5

# What a value may be (type, bounds, choices, pattern) comes from the operator's own rules
# (`tp_train.params`); this says only how each param is shown, its default and a narrower
# choice (the built-in models), so the form cannot offer what the operator refuses.
PARAMS = tp_train.params({
    "model": {"default": "transformer", "enum": ["transformer", "mlp"], "section": JOB,
              "description": "Built-in model: a small transformer learning the "
                             "project's own text character by character, or an MLP "
                             "classifier on synthetic data"},
    "steps": {"default": 600, "section": JOB,
              "description": "Training steps in total (a resumed try continues to this)"},
    "global_batch_size": {"default": 32, "section": JOB,
                          "description": "Samples per step over all data-parallel ranks; "
                                         "a multiple of nproc_per_host / "
                                         "tensor_parallel_degree"},
    "learning_rate": {"field": "optimizer.learning_rate", "default": 0.003, "section": JOB,
                      "description": "The optimizer's learning rate"},
    "optimizer_type": {"field": "optimizer.type", "default": "adam", "section": JOB,
                       "description": "Optimizer"},
    "seed": {"default": 0, "section": JOB,
             "description": "Seeds the parameters, the data and dropout"},
    "amp": {"default": False, "section": JOB,
            "description": "Automatic mixed precision: float16 matmuls with float32 master "
                           "weights and dynamic loss scaling (slower on a CPU without "
                           "float16 GEMMs; halves the gradient all-reduce)"},
    # true or false here; the operator also takes a list of checkpoint names
    "recompute": {"default": False, "type": "boolean", "section": JOB,
                  "description": "Recompute each block's activations in the backward pass "
                                 "instead of keeping them: less memory, more compute"},
    "tensor_parallel_degree": {"default": 2, "section": LAYOUT,
                               "description": "Ranks that split every layer; divides "
                                              "nproc_per_host"},
    "nproc_per_host": {"default": 2, "section": LAYOUT,
                       "description": "Worker processes (ranks) on this worker"},
    "sharding_stage": {"default": 0, "enum": [0, 1, 2], "section": LAYOUT,
                       "description": "Shard the optimizer state (1), and the gradients too "
                                      "(2), over the data-parallel ranks; 0: off"},
    # null, not "": the trigger form sends an emptied text field as null
    "hosts": {"default": None, "enum": HOST_LISTS, "section": HOSTS,
              "description": "Train on these hosts over SSH instead of this worker: "
                             "hostnames or addresses, comma-separated, nproc_per_host "
                             "ranks on each (each needs python3 and numpy; ringflow is "
                             "shipped to them). Empty: this Airflow worker. The "
                             "choices: Airflow Variable ringflow_tp_train_hosts"},
    "launcher": {"default": "ssh", "section": HOSTS,
                 "description": "With hosts: one launcher agent per host over SSH, or all of "
                                "them started by Open MPI's mpirun on the first host"},
    "ssh_conn_id": {"default": SSH_CONN_IDS[0], "enum": SSH_CONN_IDS, "section": HOSTS,
                    "description": "With hosts: the ssh connection that reaches them (its "
                                   "host is replaced by each host)"},
    "python": {"default": PYTHONS[0], "enum": PYTHONS, "section": HOSTS,
               "description": "With hosts: the interpreter on the hosts"},
    "log_every": {"default": 10, "section": RUN,
                  "description": "A progress line every this many steps"},
    "deferrable": {"default": False, "section": RUN,
                   "description": "Hand the watch of the training job to Airflow's "
                                  "triggerer: no worker slot is held while it trains (the "
                                  "job runs on, detached, under ringflow's supervisor)"},
    "poll_interval": {"default": 10, "section": RUN,
                      "description": "With deferrable: seconds between the triggerer's looks "
                                     "at the job (its lines reach the log this late)"},
    "on_existing": {"default": "reattach", "section": RUN,
                    "description": "When a retry finds the previous try's job still running: "
                                   "watch it to its end (reattach), or stop it and resume "
                                   "from the newest checkpoint (restart)"},
})

MODEL = Asset("ringflow://ringflow_tp_train/train")

with DAG(
    dag_id="ringflow_tp_train",
    description="Tensor-parallel training on CPU (ringflow TPTrainOperator)",
    schedule=None,
    catchup=False,
    params=PARAMS,
    user_defined_macros={"corpus": CORPUS},
    doc_md=__doc__,
    tags=["ringflow", "training"],
) as dag:
    TPTrainOperator(
        task_id="train",
        model="{{ params.model }}",
        # the transformer reads the corpus (its default sizes: vocab_size 512 holds the 98
        # characters), 5 % of it held out; the MLP its synthetic batches
        data="{{ corpus if params.model == 'transformer' else 'synthetic' }}",
        tokenizer="char",
        validation_fraction="{{ 0.05 if params.model == 'transformer' else 0 }}",
        eval_every=100,
        ship_data=True,
        steps="{{ params.steps }}",
        global_batch_size="{{ params.global_batch_size }}",
        optimizer='{"type": "{{ params.optimizer_type }}", '
                  '"learning_rate": {{ params.learning_rate }}}',
        seed="{{ params.seed }}",
        amp="{{ params.amp }}",
        recompute="{{ params.recompute }}",
        tensor_parallel_degree="{{ params.tensor_parallel_degree }}",
        nproc_per_host="{{ params.nproc_per_host }}",
        sharding_stage="{{ params.sharding_stage }}",
        log_every="{{ params.log_every }}",
        hosts="{{ params.hosts or '' }}",
        launcher="{{ params.launcher }}",
        ssh_conn_id="{{ params.ssh_conn_id }}",
        python="{{ params.python }}",
        deferrable="{{ params.deferrable }}",
        poll_interval="{{ params.poll_interval }}",
        on_existing="{{ params.on_existing }}",
    )


with DAG(
    dag_id="ringflow_tp_train_evaluate",
    description="Evaluates the model ringflow_tp_train produced and gates on its validation "
                "loss (scheduled on its Asset)",
    schedule=[MODEL],
    catchup=False,
    doc_md=f"""Runs when `ringflow_tp_train` publishes a model on its Asset: evaluates the
checkpoint on the training job's validation data (`TPEvaluateOperator`), writes text from
it into the task log and XCom (prompt "The operator ", 200 characters, temperature 0.8,
top-k 20, seed 1), and fails when the validation loss is above {MAX_VAL_LOSS} nats per
character (the corpus's unigram entropy is 3.45). A run started by hand (`airflow dags test
ringflow_tp_train_evaluate`, as `make demo` does) takes the Asset's newest event. A model
trained without validation data (the MLP) is skipped. A model trained on hosts is
evaluated on the first of them over `ssh_default`.""",
    tags=["ringflow", "training"],
) as evaluate_dag:

    @task(inlets=[MODEL])
    def find_model(**context) -> dict:
        """The checkpoint of the Asset event that triggered this run (or of the Asset's
        newest event), and the host that has it (None: this worker)."""
        events = context["triggering_asset_events"].get(MODEL) or context["inlet_events"][MODEL]
        if not events:
            raise AirflowSkipException(f"no model on {MODEL.uri} yet: run ringflow_tp_train")
        extra = dict(events[-1].extra)
        print(f"model at {extra.get('checkpoint')} on {extra.get('host')}, step "
              f"{extra.get('step')}, final loss {extra.get('final_loss')}, validation loss "
              f"{extra.get('val_loss')}")
        if "val_loss" not in extra:
            raise AirflowSkipException("the model was trained without validation data: "
                                       "nothing to evaluate it on")
        here = extra.get("host") == os.uname().nodename
        return {**extra, "host": None if here else extra.get("host")}

    model = "ti.xcom_pull(task_ids='find_model')"
    find_model() >> TPEvaluateOperator(
        task_id="evaluate",
        checkpoint=f"{{{{ {model}['checkpoint'] }}}}",
        host=f"{{{{ {model}['host'] or '' }}}}",
        prompt="The operator ", max_new_tokens=200, temperature=0.8, top_k=20, seed=1,
        fail_if={"val_loss": {"gt": MAX_VAL_LOSS}},
    )
