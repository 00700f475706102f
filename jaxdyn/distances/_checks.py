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


def _dtype_problem(name: str, a) -> Optional[str]:
    """What is wrong with the dtype of ``a``: a complex dtype would lose its imaginary part.

    Returns:
        The message, or None where ``a`` holds real numbers (integer, boolean, real float).
    """
    dtype = getattr(a, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(a).dtype
        except ValueError:  # ragged: the shape check speaks
            return None
    if jnp.issubdtype(dtype, jnp.complexfloating) or not (
            jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
        return f"{name} must hold real numbers, got dtype {dtype}"
    return None


def _cloud_problem(name: str, a) -> Optional[str]:
    """What is wrong with the point cloud ``a`` (None if it is a real (N, d) cloud, N, d >= 1)."""
    shape = _shape(a)
    if shape is None or len(shape) != 2:
        return f"{name} must be a point cloud of shape (N, d), got shape {shape}"
    if shape[0] == 0:
        return f"{name} must hold at least one point, got shape {shape}"
    if shape[1] == 0:
        return f"{name} must have points of dimension d >= 1, got shape {shape}"
    return _dtype_problem(name, a)


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


def _as_float_array(a, name: str):
    """``a`` as a JAX array of a float dtype (integers take the default float).

    Returns:
        The JAX array.

    Raises:
        TypeError: naming the argument, for a complex (or non-numeric) dtype.
    """
    problem = _dtype_problem(name, a)
    if problem:
        raise TypeError(problem)
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    return a
