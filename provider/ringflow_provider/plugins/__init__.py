"""The Airflow UI's training views: a "Training" tab on TPTrainOperator task instances and a
"Training runs" tab on DAGs (plugin.py registers them; app.py serves the pages and their data
endpoints under /ringflow; data.py reads what they show from Airflow's logs and XComs), and
the operator's "Training curve" extra link (links.py)."""
