"""Airflow's DAG folder entry for the example DAG `ringflow_poprun`: it lives in the provider
package (ringflow_provider.example_dags); a DAG object imported here is collected."""

from ringflow_provider.example_dags.ringflow_poprun import dag

__all__ = ["dag"]
