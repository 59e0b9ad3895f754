"""Airflow's DAG folder entry for the example DAGs `ringflow_tp_train` and
`ringflow_tp_train_evaluate`: they live in the provider package (ringflow_provider.example_dags,
with the text corpus the transformer learns); a DAG object imported here is collected."""

from ringflow_provider.example_dags.ringflow_tp_train import dag, evaluate_dag

__all__ = ["dag", "evaluate_dag"]
