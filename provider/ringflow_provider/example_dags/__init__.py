"""The provider's example DAGs, as Airflow's providers ship theirs: `ringflow_tp_train`
(with `ringflow_tp_train_evaluate`) and `ringflow_poprun`, and the text corpus the
transformer learns (`data/ringflow_corpus.txt`, package data). Airflow finds a DAG in a
file of its DAG folder, so a folder that should show them holds one import per module (the
repository's `dags/` does):

    from ringflow_provider.example_dags.ringflow_tp_train import dag, evaluate_dag

Copy a module into your DAG folder to change it.
"""
