"""Airflow provider of ringflow: PopRunOperator, TPTrainOperator and TPEvaluateOperator.

Airflow finds it through the ``apache_airflow_provider`` entry point (pyproject.toml);
importing this package imports nothing from Airflow.
"""

from __future__ import annotations

__version__ = "0.1.0"

INTEGRATION = "ringflow"


def get_provider_info() -> dict:
    """What Airflow's ProvidersManager reads through the ``apache_airflow_provider`` entry point.

    ``package-name`` must equal the distribution name; Airflow takes the version shown by
    ``airflow providers list`` from the distribution's metadata. Connections use the standard
    ``ssh`` type of apache-airflow-providers-ssh, so no connection type is declared here.
    """
    return {
        "package-name": "airflow-provider-ringflow",
        "name": "ringflow",
        "description": "Launch and supervise distributed training: Graphcore PopRun over SSH, "
                       "tensor-parallel CPU training.",
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "tags": ["ml", "distributed-training"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["ringflow_provider.operators.poprun",
                                   "ringflow_provider.operators.tp_train",
                                   "ringflow_provider.operators.tp_evaluate"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["ringflow_provider.hooks.multi_ssh"],
            }
        ],
        # The UI's training views (a plugin) are registered through the `airflow.plugins`
        # entry point, which Airflow loads however providers are discovered; listing them
        # under "plugins" here too would register them twice where providers load eagerly.
        "extra-links": ["ringflow_provider.plugins.links.TrainingCurveLink"],
    }
