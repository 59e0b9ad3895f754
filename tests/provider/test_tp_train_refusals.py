"""TPTrainOperator refuses what cannot run before any rank starts: misspelt arguments (with
the nearest name), a model builder that does not exist or builds no model, a job that does
not fit in a host's memory; and the local ranks get a minimal environment."""

from __future__ import annotations

import pytest

from ringflow_provider.operators.poprun import PopRunOperator
from ringflow_provider.operators.tp_train import TPTrainOperator
from ringflow_provider.tp_train.spec import parse_spec


def test_a_misspelt_operator_argument_is_refused_naming_the_nearest_one():
    with pytest.raises(TypeError) as err:
        TPTrainOperator(task_id="train", stpes=3, retires=2)
    assert str(err.value) == (
        "Invalid arguments were passed to TPTrainOperator (task_id: train): 'stpes' (did you "
        "mean 'steps'?), 'retires' (did you mean 'retries'?)")


def test_a_misspelt_poprun_argument_is_refused_naming_the_nearest_one():
    with pytest.raises(TypeError) as err:
        PopRunOperator(task_id="pop", hosts="h1", nproc_per_host=1, ipus_per_replica=1,
                       num_ipus=1, ipu_partition="p", vipu_server="v", training_script="t.py",
                       print_topolgy=False)
    assert str(err.value).endswith("'print_topolgy' (did you mean 'print_topology'?)")


def test_a_misspelt_field_of_the_rendered_spec_names_the_nearest_one():
    with pytest.raises(ValueError) as err:
        parse_spec({"stpes": 3})
    assert str(err.value) == ("stpes: Extra inputs are not permitted (did you mean 'steps'?) "
                              "(got 3)")
