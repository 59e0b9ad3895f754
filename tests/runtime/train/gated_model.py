"""A model builder for the interruption tests (``model: "tests.runtime.train.gated_model:build"``):
a built-in model whose batch number ``gate_step`` is not handed out until the file ``gate``
exists, so a test can kill a job at a known step. Everything else is the built-in model:
the same programs, the same batches."""

from __future__ import annotations

import os
import time

from ringflow import models
from ringflow.errors import ConfigError

WAIT_S = 60.0


def build(gate: str, gate_step: int, base: str = "mlp", *, mp_degree: int, dtype: str,
          **model_args) -> models.BuiltModel:
    model = getattr(models, base)(mp_degree=mp_degree, dtype=dtype, **model_args)
    make_batch = model.make_batch

    def gated(seed: int, step: int, batch_size: int):
        if step == gate_step:
            deadline = time.monotonic() + WAIT_S
            while not os.path.exists(gate):
                if time.monotonic() > deadline:
                    raise ConfigError(f"gate {gate} did not open within {WAIT_S} s")
                time.sleep(0.01)
        return make_batch(seed, step, batch_size)

    return models.BuiltModel(model.loss, model.feeds, gated, model.config)
