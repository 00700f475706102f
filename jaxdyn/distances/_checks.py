"""Input checks shared by the distance functions."""

from __future__ import annotations


import jax.numpy as jnp


def _check_cloud(name: str, a) -> None:
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be a point cloud of shape (N, d), got shape {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name} must hold at least one point, got shape {shape}")


def _check_pair(x, y, *, same_size: bool) -> None:
    _check_cloud("x", x)
    _check_cloud("y", y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"x and y must live in the same dimension d, got x of shape {x.shape} and y of "
            f"shape {y.shape}"
        )
    if same_size and x.shape[0] != y.shape[0]:
        raise ValueError(
            f"x and y must have the same number of points for this method, got "
            f"{x.shape[0]} and {y.shape[0]} (use method='sinkhorn' for clouds of different sizes)"
        )


def _as_float_array(a):
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    return a
