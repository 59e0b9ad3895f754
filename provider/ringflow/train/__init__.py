"""Training entry points built on the runtime: ``python -m ringflow.train.demo`` trains a
small MLP in one process (``make demo``)."""
