"""The library's cluster δ is the experiments' one: ``jaxdyn.clusters`` and the ``sphere`` kind
count the same clusters on the same cloud when neither is given a δ."""

import inspect

import numpy as np
import pytest

from jaxdyn import clusters as C
from jaxdyn.experiments.sphere.schema import SCHEMA

DELTA_FUNCTIONS = (C.cluster_labels, C.cluster_count, C.cluster_masses, C.cluster_centres)


def pairs_cloud(dtype, gap=5e-4):
    """Three well-separated pairs on S²; the points of a pair have ⟨x, y⟩ = 1 − ``gap``.

    With 1e-4 < gap < 1e-3, δ = 1e-3 joins each pair (3 components) and δ = 1e-4 does not (6).
    """
    theta = np.arccos(1.0 - gap)
    centres = np.eye(3)
    tilt = np.roll(np.eye(3), 1, axis=0)  # a unit vector orthogonal to each centre
    x = np.concatenate([centres, np.cos(theta) * centres + np.sin(theta) * tilt])
    return x.astype(dtype)


def test_default_delta_is_the_sphere_kinds_cluster_delta():
    """Every cluster function with a δ defaults to the schema's ``cluster_delta``."""
    want = SCHEMA["cluster_delta"].default
    assert want == 1e-4
    for f in DELTA_FUNCTIONS:
        assert inspect.signature(f).parameters["delta"].default == want, f.__name__


def test_the_pairs_cloud_separates_the_two_deltas(dtype):
    """The test cloud's count depends on δ: 3 pairs at 1e-3, 6 points at 1e-4."""
    xs = pairs_cloud(dtype)
    gram = xs.astype(np.float64) @ xs.astype(np.float64).T
    off = gram[np.triu_indices(6, 1)]
    assert np.sum((off > 1 - 1e-3) & (off < 1 - 1e-4)) == 3 and np.sum(off > 1 - 1e-3) == 3
    assert int(C.cluster_count(xs, 1e-3)) == 3
    assert int(C.cluster_count(xs, 1e-4)) == 6


def test_cluster_count_without_delta_counts_at_1e_4(dtype):
    """``cluster_count(xs)`` is ``cluster_count(xs, 1e-4)`` where 1e-3 would count otherwise."""
    xs = pairs_cloud(dtype)
    assert int(C.cluster_count(xs)) == int(C.cluster_count(xs, 1e-4)) == 6
    assert int(C.cluster_count(xs)) != int(C.cluster_count(xs, 1e-3))


@pytest.mark.parametrize("f", DELTA_FUNCTIONS[:1] + DELTA_FUNCTIONS[2:],
                         ids=lambda f: f.__name__)
def test_other_delta_functions_without_delta_use_1e_4(f):
    """Labels, masses and centres without δ equal their values at δ = 1e-4."""
    xs = pairs_cloud(np.float64)
    np.testing.assert_array_equal(np.asarray(f(xs)), np.asarray(f(xs, 1e-4)))
    assert not np.array_equal(np.asarray(f(xs)), np.asarray(f(xs, 1e-3)))
