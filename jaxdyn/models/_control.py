"""Time-dependent parameters of a model: :class:`Control`.

A piecewise-constant or piecewise-linear function of time on a uniform grid (the controls of
Paper B; the moment solver of :mod:`jaxdyn.gaussian` and the particle fields of
:mod:`jaxdyn.models` accept it wherever they accept a constant array).
"""

from __future__ import annotations

from typing import ClassVar, Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._params import Domain, float_dtype, invalid_parameters, parameter, to_array


class Control(eqx.Module):
    r"""A time-dependent control on a uniform grid over ``[0, t1]``.

    ``kind="piecewise"``: ``values`` has shape ``(n_pieces, *shape)`` and
    ``u(t) = values[k]`` for ``t ∈ [k t1/n, (k+1) t1/n)`` (clamped outside ``[0, t1]``).
    ``kind="linear"``: ``values`` has shape ``(n_nodes, *shape)`` at the nodes
    ``t_k = k t1/(n_nodes − 1)``, linearly interpolated (clamped outside).

    ``values`` and ``t1`` are array leaves (differentiable, vmappable); ``kind`` is static.
    ``breakpoints()`` are the jump (piecewise) or kink (linear) times, which adaptive
    solvers step to exactly.

    Args:
      values: ``(n, *shape)`` array: the pieces or the nodes.
      t1: the end of the grid, finite and > 0 (a traced one is reported by :meth:`invalid`).
      kind: ``"piecewise"`` or ``"linear"``.

    Raises:
      ValueError: for an unknown kind, too few pieces or nodes, or a concrete t1 that is not
        finite and > 0.
    """

    domains: ClassVar[Mapping[str, Domain]] = {"t1": Domain("positive", 0, "end of the control grid")}
    values: jax.Array
    t1: jax.Array
    kind: str = eqx.field(static=True, default="piecewise")

    def __init__(self, values, t1, kind: str = "piecewise"):
        if kind not in ("piecewise", "linear"):
            raise ValueError(f"Control kind must be 'piecewise' or 'linear', got {kind!r}")
        values = values if hasattr(values, "dtype") else np.asarray(values)
        values = to_array(values, float_dtype(values, default=jnp.result_type(float)))
        if values.ndim < 1 or values.shape[0] < (2 if kind == "linear" else 1):
            raise ValueError(
                "Control values must have shape (n_pieces, ...) with n_pieces >= 1 "
                f"(n_nodes >= 2 for 'linear'), got shape {values.shape}")
        self.values = values
        self.t1 = parameter(Control, "t1", t1, values.dtype)
        self.kind = kind

    @property
    def n(self) -> int:
        """The number of pieces (piecewise) or nodes (linear)."""
        return self.values.shape[0]

    @property
    def shape(self):
        """The shape of the control's value at one time."""
        return self.values.shape[1:]

    @property
    def dtype(self):
        """The dtype of the values."""
        return self.values.dtype

    def invalid(self):
        """Whether t1 lies outside its domain (a traced t1 <= 0 or non-finite).

        Returns:
          A boolean array (scalar, or the stack's shape).
        """
        return invalid_parameters(self)

    def __call__(self, t):
        """The control's value u(t).

        Args:
          t: time (scalar).

        Returns:
          An array of shape ``self.shape``.
        """
        n = self.n
        if self.kind == "piecewise":
            k = jnp.clip(jnp.floor(t / self.t1 * n), 0, n - 1).astype(jnp.int32)
            return self.values[k]
        s = jnp.clip(t / self.t1 * (n - 1), 0, n - 1)
        k = jnp.clip(jnp.floor(s), 0, n - 2).astype(jnp.int32)
        w = (s - k).astype(self.values.dtype)
        return (1 - w) * self.values[k] + w * self.values[k + 1]

    def breakpoints(self):
        """The times where u jumps (piecewise) or kinks (linear), inside (0, t1).

        Returns:
          A 1-D array of ``n − 1`` (piecewise) or ``n − 2`` (linear) times.
        """
        n = self.n
        if self.kind == "piecewise":
            return self.t1 * jnp.arange(1, n, dtype=self.values.dtype) / n
        return self.t1 * jnp.arange(1, n - 1, dtype=self.values.dtype) / (n - 1)


def at(p, t):
    """A parameter's value at time t: ``p(t)`` for a :class:`Control`, else ``p``."""
    return p(t) if isinstance(p, Control) else p
