"""Input checks shared by the distance functions."""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import numpy as np


def _shape(a):
    """``a.shape``; nested lists and tuples (accepted wherever arrays are) by NumPy's rule."""
    shape = getattr(a, "shape", None)
    if shape is None and isinstance(a, (list, tuple)):
        try:
            shape = np.shape(a)
        except ValueError:  # ragged
            shape = None
    return shape


def _cloud_problem(name: str, a) -> Optional[str]:
    """What is wrong with the point cloud ``a`` (None if it is an (N, d) cloud, N >= 1)."""
    shape = _shape(a)
    if shape is None or len(shape) != 2:
        return f"{name} must be a point cloud of shape (N, d), got shape {shape}"
    if shape[0] == 0:
        return f"{name} must hold at least one point, got shape {shape}"
    return None


def pair_problem(x, y, *, same_size: bool) -> Optional[str]:
    """What is wrong with the clouds x, y (None if both are (N, d) clouds of one d, of one N if asked)."""
    for name, a in (("x", x), ("y", y)):
        problem = _cloud_problem(name, a)
        if problem:
            return problem
    xs, ys = _shape(x), _shape(y)
    if xs[1] != ys[1]:
        return (f"x and y must live in the same dimension d, got x of shape {xs} and y of "
                f"shape {ys}")
    if same_size and xs[0] != ys[0]:
        return (f"x and y must have the same number of points for this method, got "
                f"{xs[0]} and {ys[0]} (use method='sinkhorn' for clouds of different sizes)")
    return None


def _as_float_array(a):
    """``a`` as a JAX array of a float dtype (integers take the default float)."""
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    return a
