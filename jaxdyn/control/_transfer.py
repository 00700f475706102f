"""Transfer of controls to N particles and to an L-layer transformer; W2 of a cloud to a
Gaussian target."""

from __future__ import annotations

import math
from typing import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..distances import bures_w2_squared, w2_exact
from ..gaussian._particles import gaussian_cloud
from ..integrators import INTEGRATORS
from ..models._control import Control
from ..models._fields import EuclideanAttention
from ..simulation._simulate import fixed_steps, saved_states


# ---------------------------------------------------------------------------------------
# Transfer to particles and to a discrete transformer
# ---------------------------------------------------------------------------------------


#: the controlled particle field of Paper B is :class:`jaxdyn.models.EuclideanAttention` with
#: :class:`Control` parameters (the name users of ``jaxdyn.control`` know)
ControlledEuclideanAttention = EuclideanAttention


def _piece_info(model):
    """(piecewise?, n_pieces, t1) of a model's Controls (all must share the grid)."""
    ctrls = [p for p in (model.A, model.B, model.V, model.b) if isinstance(p, Control)]
    if not ctrls:
        return False, 1, None
    kinds = {c.kind for c in ctrls}
    ns = {(c.kind, c.n) for c in ctrls}
    if len(kinds) != 1 or len(ns) != 1:
        raise ValueError("all Controls of the model must share one grid (same kind and length)")
    c = ctrls[0]
    return c.kind == "piecewise", (c.n if c.kind == "piecewise" else c.n - 1), c.t1


def _piece_flow(model, x0, t1, n_pieces, steps_per_piece, piecewise, method, idx):
    """The states after the pieces ``idx`` (static, in pieces) of ``[0, t1]`` cut into
    ``n_pieces``: ``steps_per_piece`` steps of ``method`` (``jaxdyn.integrators``) in each
    piece, starting at ``k h``, with the controls frozen at the piece's midpoint
    (``piecewise``) or the time-dependent field. The loops are :func:`simulate`'s
    (``saved_states`` over pieces, ``fixed_steps`` within one)."""
    integ = INTEGRATORS[method]()
    dtype = x0.dtype
    h = jnp.asarray(t1, dtype) / n_pieces
    dt = h / steps_per_piece

    def advance(x, k_start, n):
        def piece(x, k):
            tk = k.astype(dtype) * h
            field = model.at(tk + 0.5 * h) if piecewise else model
            return fixed_steps(integ, field, x, tk, dt, steps_per_piece), None

        x, _ = jax.lax.scan(piece, x, k_start + jnp.arange(n))
        return x

    return saved_states(x0, idx, advance)


@eqx.filter_jit
def _flow(model, x0, t1, n_intervals, steps_per_interval, piecewise, method):
    return _piece_flow(model, x0, t1, n_intervals, steps_per_interval, piecewise, method,
                       tuple(range(n_intervals + 1)))


def transfer_particles(model, x0, *, t1, steps_per_piece: int = 16, method: str = "rk4"):
    r"""Integrate the particle system ``model`` (a :class:`ControlledEuclideanAttention`, or a
    controls mapping) from ``x0`` (N, d) on ``[0, t1]``.

    Piecewise-constant controls are integrated piece by piece with the controls frozen
    (no step straddles a jump); linear controls with the time-dependent field. Fixed-step
    ``method`` (``"rk4"`` or ``"euler"``), ``steps_per_piece`` steps in each piece.

    Returns: (n_pieces + 1, N, d) — the cloud at ``t = k t1 / n_pieces``.
    """
    if isinstance(model, Mapping):
        model = ControlledEuclideanAttention.from_controls(model)
    if method not in ("rk4", "euler"):
        raise ValueError(f"method must be 'rk4' or 'euler', got {method!r}")
    x0 = jnp.asarray(x0)
    if x0.ndim != 2 or x0.shape[1] != model.dim:
        raise ValueError(f"x0 must have shape (N, {model.dim}), got {x0.shape}")
    if int(steps_per_piece) < 1:
        raise ValueError(f"steps_per_piece must be >= 1, got {steps_per_piece}")
    piecewise, n, _ = _piece_info(model)
    return _flow(model, x0, float(t1), int(n), int(steps_per_piece), bool(piecewise), method)


@eqx.filter_jit
def _layers(model, x0, t1, n_layers):
    # one projected-Euler step (the identity retraction in R^d) a layer, controls at the
    # layer's midpoint
    return _piece_flow(model, x0, t1, n_layers, 1, True, "euler", (0, n_layers))[-1]


def transformer_layers(model, x0, *, t1, n_layers: int):
    r"""The L-layer transformer: ``x_{l+1} = x_l + (t1/L) f_l(x_l)``, ``l = 0 … L−1`` (one
    explicit Euler step a layer), where layer l uses the controls at the midpoint of its
    interval ``[l t1/L, (l+1) t1/L]`` — for piecewise-constant controls and L a multiple
    of n_pieces, exactly the piece the layer lies in. Returns the final cloud (N, d).
    """
    if isinstance(model, Mapping):
        model = ControlledEuclideanAttention.from_controls(model)
    if int(n_layers) < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    x0 = jnp.asarray(x0)
    if x0.ndim != 2 or x0.shape[1] != model.dim:
        raise ValueError(f"x0 must have shape (N, {model.dim}), got {x0.shape}")
    return _layers(model, x0, float(t1), int(n_layers))


def cloud_w2_to_gaussian(x, m1, S1, *, seed: int = 0, exact: bool = True,
                         exact_max: int = 2000) -> dict:
    r"""Distance of a particle cloud ``x`` (N, d) to the Gaussian ``N(m1, S1)``.

    Returns a dict:

    * ``bures``: Bures W2 between ``N(x̄, Ĉ)`` (empirical mean and covariance, 1/N) and the
      target. It compares moments only (0 for any cloud with the target's moments) and
      its Monte-Carlo error decays like ``N^{-1/2}``.
    * ``exact``: W2 by optimal assignment between ``x`` and N i.i.d. samples of the target
      (:func:`jaxdyn.distances.w2_exact`), for ``N ≤ exact_max``; it contains sampling noise.
    * ``floor``: the same between two independent N-samples of the target — the value
      ``exact`` would take for a perfect cloud (it decays slowly, like ``N^{-1/d}`` for d ≥ 3).

    ``exact`` and ``floor`` are NaN when skipped.
    """
    x = np.asarray(x, np.float64)
    m1 = np.asarray(m1, np.float64)
    S1 = np.asarray(S1, np.float64)
    if x.ndim != 2 or x.shape[1] != m1.shape[0]:
        raise ValueError(f"x must have shape (N, {m1.shape[0]}), got {x.shape}")
    n = x.shape[0]
    xbar = x.mean(axis=0)
    C = (x - xbar).T @ (x - xbar) / n
    out = {"bures": float(np.sqrt(max(float(bures_w2_squared(jnp.asarray(xbar), jnp.asarray(C),
                                                               jnp.asarray(m1), jnp.asarray(S1))),
                                      0.0))),
           "exact": math.nan, "floor": math.nan, "n": n}
    if exact and n <= exact_max and np.all(np.isfinite(x)):
        rng = np.random.default_rng([int(seed), 0x7A3C])  # a stream of its own
        y = gaussian_cloud(rng, n, m1, S1)
        y2 = gaussian_cloud(rng, n, m1, S1)
        out["exact"] = w2_exact(x, y)
        out["floor"] = w2_exact(y2, y)
    return out
