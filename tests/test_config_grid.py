"""Sweep values given as range / linspace / logspace, and their errors."""

import numpy as np
import pytest

from jaxdyn.config import ConfigError
from jaxdyn.experiments.engine import resolve_config


def _sweep(**sweep):
    return resolve_config({"kind": "sphere", "sweep": sweep})["sweep"]


def test_grid_forms_expand():
    s = _sweep(seed={"range": [0, 5]}, beta={"linspace": [0.5, 2.0, 4]})
    assert s["seed"] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(s["beta"], [0.5, 1.0, 1.5, 2.0])
    s = _sweep(seed={"range": [10, 0, -5]}, beta={"logspace": [0.1, 100.0, 4]})
    assert s["seed"] == [10, 5]
    np.testing.assert_allclose(s["beta"], [0.1, 1.0, 10.0, 100.0])


@pytest.mark.parametrize("spec,match", [
    ({"arange": [0, 3]}, "expected a list of values or one of"),
    ({"range": [0, 3], "linspace": [0, 1, 2]}, "expected a list of values or one of"),
    ({"range": [0, 3.5]}, "sweep.seed.range"),
    ({"range": [0, 3, 0]}, "step != 0"),
    ({"range": "0:3"}, "expected a list of numbers"),
    ({"range": [3, 0]}, "non-empty"),
])
def test_bad_integer_grids_name_the_field(spec, match):
    with pytest.raises(ConfigError, match=match):
        _sweep(seed=spec)


@pytest.mark.parametrize("spec,match", [
    ({"linspace": [0.1, 1.0]}, "sweep.beta.linspace"),
    ({"linspace": [0.1, 1.0, 2.5]}, "integer num"),
    ({"logspace": [0.0, 1.0, 3]}, "must be > 0"),
    ({"linspace": [-1.0, 1.0, 3]}, "beta"),  # the values themselves are still checked (β > 0)
])
def test_bad_float_grids_name_the_field(spec, match):
    with pytest.raises(ConfigError, match=match):
        _sweep(beta=spec)
