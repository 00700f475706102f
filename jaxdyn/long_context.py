r"""Long context: observables of one attention layer and of the dynamics at β = β(n).

Beside the host half :mod:`jaxdyn.long_context_host` (re-exported here: :func:`resolve_beta`,
the closed forms and the Poisson limit law), the quantities the long-context study measures,
each computed by jaxdyn's kernels in O(n) memory (no n × n matrix):

- :func:`angle_ratio` / :func:`layer_angle_ratio`: λ = the mean over the pairs (i, i + 1 mod n)
  of ∠(T_i, T_{i+1}) / ∠(x_i, x_{i+1}), T_i = Σ_j w_ij x_j one attention layer (V = I,
  softmax weights β⟨x_i, x_j⟩) on unit tokens: λ → 0 when the layer collapses the tokens, λ →
  1 when it acts as the identity (docs/math.md, section I states it and its closed
  form for exactly equiangular tokens);
- :func:`mean_inner_product`: (n|x̄|² − 1)/(n − 1), the mean of ⟨x_i, x_j⟩ over i ≠ j, in O(n);
- :func:`circle_cluster_counts`: the cluster count of clouds on S¹ from their histogram, by
  :func:`jaxdyn.pde.cluster_counts`;
- :func:`graph_cluster_counts` (host, SciPy): the cluster count of large clouds on S^{d−1} from
  the radius graph of all their points (:func:`cluster_graph_radius`, :func:`mean_spacing`);
- the per-query weight statistics are :func:`jaxdyn.kernels.weight_statistics`.

Token clouds: :func:`equiangular_tokens` (exactly equiangular, a regular simplex scaled and
shifted, in R^n) and :func:`nearly_equiangular_tokens` (√ρ e₁ + √(1 − ρ) z_i, z_i uniform on
the unit sphere of e₁⊥, in any R^d).

Every function runs under ``jax.jit``/``jax.vmap`` with traced clouds and β; a traced β that
is not a finite number > 0 gives NaN (λ) — concrete ones are refused by a ``ValueError``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import is_traced
from .kernels import interaction
from .long_context_host import (
    BETA_SCALES as BETA_SCALES,
    cap_constant as cap_constant,
    critical_exponent as critical_exponent,
    critical_gamma as critical_gamma,
    equiangular_angle_ratio as equiangular_angle_ratio,
    equiangular_self_weight as equiangular_self_weight,
    cluster_graph_radius as cluster_graph_radius,
    first_cluster_count as first_cluster_count,
    graph_cluster_counts as graph_cluster_counts,
    graph_cluster_sizes as graph_cluster_sizes,
    mean_spacing as mean_spacing,
    poisson_limit_weights as poisson_limit_weights,
    resolve_beta as resolve_beta,
)
from .pde import cluster_counts

__all__ = [
    "BETA_SCALES",
    "angle_ratio",
    "cap_constant",
    "circle_cluster_counts",
    "cluster_graph_radius",
    "critical_exponent",
    "critical_gamma",
    "equiangular_angle_ratio",
    "equiangular_self_weight",
    "equiangular_tokens",
    "first_cluster_count",
    "graph_cluster_counts",
    "graph_cluster_sizes",
    "layer_angle_ratio",
    "mean_inner_product",
    "mean_spacing",
    "nearly_equiangular_tokens",
    "poisson_limit_weights",
    "resolve_beta",
]


def _check_cloud(name, x, min_points=2):
    if getattr(x, "ndim", 0) < 2 or x.shape[-2] < min_points or x.shape[-1] < 2:
        raise ValueError(f"{name} must be (..., n, d) with n >= {min_points} tokens and d >= 2, "
                         f"got shape {tuple(getattr(x, 'shape', ()))}")


def _angle(a, b):
    """∠(a, b) row by row, by atan2(|a × b|, a·b): accurate for small and large angles."""
    na = jnp.linalg.norm(a, axis=-1, keepdims=True)
    nb = jnp.linalg.norm(b, axis=-1, keepdims=True)
    ua, ub = a / na, b / nb
    dot = jnp.sum(ua * ub, axis=-1)
    sin = jnp.linalg.norm(ub - dot[..., None] * ua, axis=-1)
    return jnp.arctan2(sin, dot)


def angle_ratio(x, out):
    """λ: the mean of ∠(out_i, out_{i+1}) / ∠(x_i, x_{i+1}) over i (indices mod n).

    Args:
      x: (..., n, d) input tokens.
      out: (..., n, d) the layer's outputs (any norms: only directions count).

    Returns:
      (...,) λ; pairs whose input angle is 0 (duplicates) are left out (NaN if every pair is).

    Raises:
      ValueError: shapes that differ or are not (..., n, d) with n ≥ 2, d ≥ 2.
    """
    _check_cloud("x", x)
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"angle_ratio: out must have the shape of x {tuple(x.shape)}, got "
                         f"{tuple(out.shape)}")
    a_in = _angle(x, jnp.roll(x, -1, axis=-2))
    a_out = _angle(out, jnp.roll(out, -1, axis=-2))
    keep = a_in > 0
    ratio = jnp.where(keep, a_out / jnp.where(keep, a_in, 1.0), 0.0)
    return jnp.sum(ratio, axis=-1) / jnp.sum(keep, axis=-1)


def layer_angle_ratio(x, beta, *, kernel: str = "blocked", **kw):
    """λ of one attention layer T_i = Σ_j w_ij x_j (V = I, B = I) on the tokens ``x``.

    Args:
      x: (n, d) unit tokens.
      beta: β (a number, traced allowed: NaN where not finite > 0).
      kernel: :func:`jaxdyn.kernels.interaction`'s kernel (no n × n matrix but ``"dense"``).
      **kw: further options of :func:`jaxdyn.kernels.interaction` (blocks, ``tol``).

    Returns:
      ``(λ, T)``: the scalar λ (:func:`angle_ratio`) and the (n, d) outputs.

    Raises:
      ValueError: ``x`` not (n, d) with n ≥ 2, or a concrete β that is not finite > 0.
    """
    _check_cloud("x", x)
    if x.ndim != 2:
        raise ValueError(f"layer_angle_ratio: x must be one cloud (n, d), got {tuple(x.shape)}")
    if not is_traced(beta):
        resolve_beta(beta, x.shape[0])  # the named error of a bad β
    b = jnp.asarray(beta, x.dtype)
    ok = jnp.isfinite(b) & (b > 0)
    out = interaction(x, x, jnp.eye(x.shape[1], dtype=x.dtype), jnp.where(ok, b, 1.0),
                      kernel=kernel, **kw)
    return jnp.where(ok, angle_ratio(x, out), jnp.nan), out


def mean_inner_product(xs):
    """The mean of ⟨u_i, u_j⟩ over pairs i ≠ j of the directions u = x/|x|: (n|ū|² − 1)/(n − 1).

    Args:
      xs: (..., n, d) clouds.

    Returns:
      (...,) the mean inner product (O(n) work).

    A ValueError refuses ``xs`` not (..., n, d) with n ≥ 2.
    """
    _check_cloud("xs", xs)
    n = xs.shape[-2]
    u = xs / jnp.linalg.norm(xs, axis=-1, keepdims=True)
    ubar = jnp.mean(u, axis=-2)
    return (n * jnp.sum(ubar * ubar, axis=-1) - 1.0) / (n - 1)


def circle_cluster_counts(xs, cells: int, **kw):
    """The cluster count of clouds on S¹ from their histogram on ``cells`` equal arcs.

    The histogram's cell averages (count / (n · 2π/M)) are a density on S¹ whose clusters
    :func:`jaxdyn.pde.cluster_counts` counts (0 before the cloud has broken up).

    Args:
      xs: (..., n, 2) clouds on S¹.
      cells: the number of arcs M (≥ 4).
      **kw: the thresholds of :func:`jaxdyn.pde.cluster_counts` (``level``, ``min_mass``, …).

    Returns:
      (...,) integer counts (−1 for a traced cloud that is not finite).

    Raises:
      ValueError: ``xs`` not (..., n, 2), or fewer than 4 cells.
    """
    if getattr(xs, "ndim", 0) < 2 or xs.shape[-1] != 2:
        raise ValueError(f"circle_cluster_counts: xs must be (..., n, 2) points of S¹, got shape "
                         f"{tuple(getattr(xs, 'shape', ()))}")
    if isinstance(cells, bool) or not isinstance(cells, (int, np.integer)) or cells < 4:
        raise ValueError(f"cells must be an integer >= 4, got {cells!r}")
    xs = jnp.asarray(xs)
    n = xs.shape[-2]
    theta = jnp.mod(jnp.arctan2(xs[..., 1], xs[..., 0]), 2 * jnp.pi)
    idx = jnp.clip((theta * (cells / (2 * jnp.pi))).astype(jnp.int32), 0, cells - 1)
    flat = idx.reshape(-1, n)
    hist = jax.vmap(lambda i: jnp.zeros(cells, xs.dtype).at[i].add(1.0))(flat)
    rho = (hist / (n * 2 * jnp.pi / cells)).reshape(*xs.shape[:-2], cells)
    if not is_traced(xs):
        rho = np.asarray(rho)
    return cluster_counts(rho, **kw)


def equiangular_tokens(n: int, rho: float, dtype=np.float64):
    """Unit vectors x_1, …, x_n in R^n with pairwise inner product exactly ρ (to rounding).

    A regular simplex u_i (the centred basis vectors e_i − 1/n, normalised: ⟨u_i, u_j⟩ =
    −1/(n − 1)) scaled and shifted along the unit normal f = 1/√n of its hyperplane:
    x_i = α u_i + β₀ f with α² = (1 − ρ)(n − 1)/n, β₀² = 1 − α².

    Args:
      n: the number of tokens (≥ 2).
      rho: the inner product, in [0, 1).
      dtype: NumPy float dtype.

    Returns:
      (n, n) NumPy array.

    Raises:
      ValueError: n < 2 or ρ outside [0, 1).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if not 0 <= rho < 1:
        raise ValueError(f"rho must lie in [0, 1), got {rho!r}")
    u = np.eye(n) - 1.0 / n
    u /= math.sqrt((n - 1) / n)
    alpha2 = (1 - rho) * (n - 1) / n
    return (math.sqrt(alpha2) * u + math.sqrt(1 - alpha2) / math.sqrt(n)).astype(dtype)


def nearly_equiangular_tokens(key, n: int, d: int, rho, dtype=jnp.float32):
    """Tokens √ρ e₁ + √(1 − ρ) z_i, z_i i.i.d. uniform on the unit sphere of e₁⊥ ⊂ R^d.

    Their inner products are ρ + (1 − ρ)⟨z_i, z_j⟩, ⟨z_i, z_j⟩ of mean 0 and variance
    1/(d − 1): nearly equiangular when d is large.

    Args:
      key: a ``jax.random`` key.
      n: the number of tokens.
      d: the dimension (≥ 3).
      rho: ρ in [0, 1) (traced allowed: NaN tokens outside).
      dtype: float dtype.

    Returns:
      (n, d) unit tokens.

    Raises:
      ValueError: n < 2, d < 3, or a concrete ρ outside [0, 1).
    """
    if n < 2 or d < 3:
        raise ValueError(f"nearly_equiangular_tokens: n >= 2 and d >= 3 needed, got {n}, {d}")
    if not is_traced(rho) and not 0 <= float(rho) < 1:
        raise ValueError(f"rho must lie in [0, 1), got {rho!r}")
    z = jax.random.normal(key, (n, d - 1), dtype)
    z = z / jnp.linalg.norm(z, axis=1, keepdims=True)
    r = jnp.asarray(rho, dtype)
    r = jnp.where((r >= 0) & (r < 1), r, jnp.nan)
    head = jnp.full((n, 1), jnp.sqrt(r), dtype)
    return jnp.concatenate([head, jnp.sqrt(1 - r) * z], axis=1)
