"""Job specs refused before anything starts: a misspelt name comes back with the nearest
one (the runtime's rule, `ringflow.errors.did_you_mean`, which the provider uses too)."""

from __future__ import annotations

import pytest

from ringflow.errors import ConfigError, did_you_mean
from ringflow.train.spec import JobSpec


def test_did_you_mean_names_the_nearest_known_name_or_nothing():
    assert did_you_mean("stpes", ["steps", "seed"]) == " (did you mean 'steps'?)"
    assert did_you_mean("zzz", ["steps", "seed"]) == ""


@pytest.mark.parametrize("mapping, hint", [
    ({"stpes": 3}, "unknown field 'stpes' in the job spec (did you mean 'steps'?)"),
    ({"model": "mlp", "model_args": {"hiden_size": 8}},
     "unknown argument 'hiden_size' for mlp (did you mean 'hidden_size'?)"),
    ({"optimizer": {"type": "adam", "learning_rat": 0.1}},
     "unknown argument 'learning_rat' for adam (did you mean 'learning_rate'?)"),
    ({"lr_schedule": {"type": "step", "step_sise": 3}},
     "unknown argument 'step_sise' for step (did you mean 'step_size'?)"),
])
def test_a_misspelt_spec_name_is_refused_with_the_nearest_name(mapping, hint):
    with pytest.raises(ConfigError) as err:
        JobSpec.from_dict(mapping)
    assert hint in str(err.value)
