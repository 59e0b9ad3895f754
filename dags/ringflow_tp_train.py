"""Train a small transformer (or an MLP) with tensor and data parallelism on this Airflow worker's
CPU, with ringflow's `TPTrainOperator`.

`nproc_per_host` worker processes (ranks) run the job: `tensor_parallel_degree` consecutive
ranks split every layer, the others are data-parallel replicas. The defaults train the
transformer with degree 2 on 2 ranks; the loss falls from about 6.2 to about 0.3 in 200 steps
(about 15 s here).

What you get: a progress line every `log_every` steps in the task log, a summary in XCom
(`final_loss`, `loss_history`, `samples_per_s`, the checkpoint, the log folder, the plot), a
loss chart at the end of the log and as `loss.png` in the log folder, and an event on the
Asset `ringflow://ringflow_tp_train/train` carrying the checkpoint, which a downstream DAG can
be scheduled on (`ringflow_tp_train_evaluate` below is one).

With the "Hosts" params set (`{"hosts": "trainer-a,trainer-b"}`), the same job runs on those
hosts over SSH (or Open MPI's mpirun) instead: `nproc_per_host` ranks on each, tensor
parallel inside a host, data parallel across; checkpoints on each host's disk.

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

from airflow.sdk import DAG, Asset, task

from ringflow_provider import tp_train
from ringflow_provider.operators.tp_train import TPTrainOperator

JOB, LAYOUT, HOSTS, RUN = "Training job", "Layout", "Hosts", "Run"
#: the host lists the form offers (null: this Airflow worker), from the Variable
HOST_LISTS = [None, *tp_train.variable_choices("ringflow_tp_train_hosts")]
#: the ssh connections and the hosts' interpreters the form offers (the first: the default)
SSH_CONN_IDS = ["ssh_default"]
PYTHONS = ["python3"]

# What a value may be (type, bounds, choices, pattern) comes from the operator's own rules
# (`tp_train.params`); this says only how each param is shown, its default and a narrower
# choice (the built-in models), so the form cannot offer what the operator refuses.
PARAMS = tp_train.params({
    "model": {"default": "transformer", "enum": ["transformer", "mlp"], "section": JOB,
              "description": "Built-in model: a small transformer on a synthetic next-token "
                             "task, or an MLP classifier"},
    "steps": {"default": 200, "section": JOB,
              "description": "Training steps in total (a resumed try continues to this)"},
    "global_batch_size": {"default": 32, "section": JOB,
                          "description": "Samples per step over all data-parallel ranks; "
                                         "a multiple of nproc_per_host / "
                                         "tensor_parallel_degree"},
    "learning_rate": {"field": "optimizer.learning_rate", "default": 0.001, "section": JOB,
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
    doc_md=__doc__,
    tags=["ringflow", "training"],
) as dag:
    TPTrainOperator(
        task_id="train",
        model="{{ params.model }}",
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
    description="Runs when ringflow_tp_train produced a model (scheduled on its Asset)",
    schedule=[MODEL],
    catchup=False,
    tags=["ringflow", "training"],
) as evaluate_dag:

    @task
    def report_model(**context) -> dict:
        """Reads the Asset event: where the checkpoint is and how good it was."""
        events = context["triggering_asset_events"][MODEL]
        extra = dict(events[-1].extra) if events else {}
        print(f"model at {extra.get('checkpoint')} on {extra.get('host')}, step "
              f"{extra.get('step')}, final loss {extra.get('final_loss')}")
        return extra

    report_model()
