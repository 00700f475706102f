"""Input checks shared by the distance functions."""

from __future__ import annotations


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


def _check_cloud(name: str, a) -> None:
    shape = _shape(a)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be a point cloud of shape (N, d), got shape {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name} must hold at least one point, got shape {shape}")


def _check_pair(x, y, *, same_size: bool) -> None:
    _check_cloud("x", x)
    _check_cloud("y", y)
    xs, ys = _shape(x), _shape(y)
    if xs[1] != ys[1]:
        raise ValueError(
            f"x and y must live in the same dimension d, got x of shape {xs} and y of "
            f"shape {ys}"
        )
    if same_size and xs[0] != ys[0]:
        raise ValueError(
            f"x and y must have the same number of points for this method, got "
            f"{xs[0]} and {ys[0]} (use method='sinkhorn' for clouds of different sizes)"
        )


def _as_float_array(a):
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    return a
