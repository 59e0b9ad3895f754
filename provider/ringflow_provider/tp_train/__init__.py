"""TPTrainOperator's parts without Airflow: the job spec at the boundary (`spec`), the
argument rules (`args`), and what the job's lines become (`report`)."""
