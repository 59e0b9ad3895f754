"""Airflow provider of ringflow: PopRunOperator and TPTrainOperator."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """What Airflow's ProvidersManager reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-provider-ringflow",
        "name": "ringflow",
        "description": "Launch and supervise distributed training: Graphcore PopRun over SSH, "
                       "tensor-parallel CPU training.",
        "versions": [__version__],
    }
