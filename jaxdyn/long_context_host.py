r"""Long-context scalings of the inverse temperature and their closed forms, importing no JAX.

The host half of :mod:`jaxdyn.long_context` (which re-exports every name here): the resolver
of β as a function of the number of tokens n, and the predictions the long-context study
checks (docs/math.md, section I):

- ``{"scale": "log", "gamma": γ}`` gives β = γ log n (the critical attention scaling of
  nearly equiangular tokens: collapse for γ < γ_c = 1/(1 − ρ), identity above);
- ``{"scale": "power", "c": c}`` gives β = c n^{2/(d−1)} (uniform keys on S^{d−1}: the
  largest weight → 0 for c → 0, a finite set of nearest keys keeps the mass at c ~ 1, all of
  it on the nearest key for c → ∞);
- a number gives β itself.

Cluster counts of large clouds on S^{d−1} (:func:`graph_cluster_counts`): the components of
the graph of the points within a chord distance r of each other, over all n points, on the host
(SciPy's k-d tree and sparse graph components, imported when called), with r from the mean
spacing of n points (:func:`cluster_graph_radius`) and a minimum size that leaves stragglers
uncounted.

Closed forms: the self-weight and the angle ratio λ of exactly equiangular tokens, and the
limit law of the ordered weights at β = c n^{2/(d−1)} (keys near the query form a Poisson
process), sampled in NumPy.

Checks: a concrete invalid parameter raises a ``ValueError`` naming it; a traced γ or c (under
``jax.jit``/``jax.vmap``) gives a traced β that is NaN where the parameter is invalid.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

__all__ = [
    "BETA_SCALES",
    "cap_constant",
    "critical_exponent",
    "critical_gamma",
    "equiangular_angle_ratio",
    "equiangular_self_weight",
    "cluster_graph_radius",
    "first_cluster_count",
    "graph_cluster_counts",
    "graph_cluster_sizes",
    "mean_spacing",
    "poisson_limit_weights",
    "resolve_beta",
]

#: The named scalings of β with n and each one's parameter.
BETA_SCALES = {"log": "gamma", "power": "c"}


def _concrete(v):
    """``float(v)``, or None for a traced value (a tracer refuses ``float``)."""
    try:
        return float(v)
    except (TypeError, ValueError) as e:
        if isinstance(v, (str, bytes)) or "Tracer" not in type(v).__name__:
            raise ValueError(f"expected a number, got {v!r}") from e
        return None
    except Exception:  # JAX's concretization error: a traced value
        return None


def critical_exponent(d: int) -> float:
    """The exponent 2/(d − 1) of the critical scale β_n* ≍ n^{2/(d−1)} on S^{d−1}.

    Args:
      d: the ambient dimension (the sphere S^{d−1}), an integer ≥ 2.

    Returns:
      2/(d − 1).

    Raises:
      ValueError: d not an integer ≥ 2.
    """
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2:
        raise ValueError(f"d (the dimension of R^d ⊃ S^(d-1)) must be an integer >= 2, got {d!r}")
    return 2.0 / (int(d) - 1)


def _positive(name: str, v, why: str):
    """A concrete parameter checked > 0 and finite (returned as float); a traced one as is."""
    if isinstance(v, bool):
        raise ValueError(f"{name} must be a number, got {v!r}")
    f = _concrete(v)
    if f is not None and not (math.isfinite(f) and f > 0):
        raise ValueError(f"{name} must be a finite number > 0 ({why}), got {v!r}")
    return v if f is None else f


def _nan_unless_positive(value, param):
    """A traced β: NaN where its parameter is not a finite number > 0 (module doc)."""
    import jax.numpy as jnp  # only reached with a tracer: JAX is loaded

    return jnp.where(jnp.isfinite(param) & (param > 0), value, jnp.nan)


def resolve_beta(beta, n: int, d: int | None = None):
    """β for n tokens: a number, ``{"scale": "log", "gamma": γ}`` or ``{"scale": "power", "c": c}``.

    Args:
      beta: a number β > 0 (returned as is), or a mapping: ``scale: log`` with ``gamma`` (β =
        γ log n) or ``scale: power`` with ``c`` (β = c n^{2/(d−1)}). γ, c (and a bare β) may
        be traced.
      n: the number of tokens (keys), an integer ≥ 2.
      d: the dimension of R^d ⊃ S^{d−1} (needed by ``power``).

    Returns:
      β: a float for concrete parameters; a traced scalar (NaN where γ or c is not a finite
      number > 0) for traced ones.

    Raises:
      ValueError: an unknown scale or key, a missing parameter or ``d``, n < 2, or a concrete
        β, γ or c that is not a finite number > 0.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n (the number of tokens) must be an integer >= 2, got {n!r}")
    if not isinstance(beta, Mapping):
        b = _positive("beta", beta, "the inverse temperature")
        return b if isinstance(b, float) else _nan_unless_positive(b, b)
    scale = beta.get("scale")
    if scale not in BETA_SCALES:
        raise ValueError(f"beta: 'scale' must be one of {sorted(BETA_SCALES)} (β = γ log n or "
                         f"β = c n^(2/(d-1))), got {scale!r}")
    key = BETA_SCALES[scale]
    extra = sorted(set(beta) - {"scale", key})
    if extra or key not in beta:
        raise ValueError(f"beta with scale {scale!r} takes exactly the key {key!r} beside "
                         f"'scale'; got keys {sorted(beta)}")
    p = _positive(f"beta.{key}", beta[key], "the scale's factor")
    if scale == "log":
        value = p * math.log(n)
    else:
        if d is None:
            raise ValueError("beta with scale 'power' (β = c n^(2/(d-1))) needs the dimension d")
        value = p * float(n) ** critical_exponent(d)
    return value if isinstance(p, float) else _nan_unless_positive(value, p)


def critical_gamma(rho):
    """γ_c = 1/(1 − ρ): the critical factor of β = γ log n for tokens with inner products ρ.

    Args:
      rho: the pairwise inner product, in [0, 1) (array-like, NumPy).

    Returns:
      γ_c (NumPy float64, the shape of ``rho``).

    Raises:
      ValueError: ρ outside [0, 1).
    """
    rho = np.asarray(rho, float)
    if not np.all((rho >= 0) & (rho < 1)):
        raise ValueError(f"rho (the tokens' pairwise inner product) must lie in [0, 1), got {rho}")
    return 1.0 / (1.0 - rho)


def _equiangular_check(n, beta, rho):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n (the number of tokens) must be an integer >= 2, got {n!r}")
    beta = np.asarray(beta, float)
    if not np.all(np.isfinite(beta) & (beta > 0)):
        raise ValueError(f"beta must be finite numbers > 0, got {beta}")
    rho = np.asarray(rho, float)
    if not np.all((rho > -1.0 / (n - 1)) & (rho < 1)):
        raise ValueError(f"rho must lie in (-1/(n-1), 1) for n = {n} unit vectors with pairwise "
                         f"inner product rho, got {rho}")
    return beta, rho


def equiangular_self_weight(n: int, beta, rho):
    """The weight a token gives itself when n unit tokens have pairwise inner product ρ.

    w = 1/(1 + (n − 1) e^{−β(1 − ρ)}) (every other token has logit βρ, the token itself β).

    Args:
      n: the number of tokens (≥ 2).
      beta: inverse temperature(s) > 0 (NumPy broadcasting with ``rho``).
      rho: pairwise inner product(s) in (−1/(n−1), 1).

    Returns:
      NumPy float64 weights.

    A ValueError refuses n < 2, β not finite > 0, or ρ outside (−1/(n−1), 1).
    """
    beta, rho = _equiangular_check(n, beta, rho)
    return 1.0 / (1.0 + (n - 1) * np.exp(-beta * (1.0 - rho)))


def equiangular_angle_ratio(n: int, beta, rho):
    """λ = ∠(T_i, T_k)/∠(x_i, x_k) for exactly equiangular tokens (one attention layer, V = I).

    T_i = Σ_j w_ij x_j = a x_i + b S with S = Σ_j x_j, b = (1 − w)/(n − 1), a = w − b (w the
    self-weight); ⟨x_i, S⟩ = 1 + (n − 1)ρ and |S|² = n(1 + (n − 1)ρ) give cos ∠(T_i, T_k)
    in closed form.

    Args:
      n: the number of tokens (≥ 2).
      beta: inverse temperature(s) > 0.
      rho: pairwise inner product(s) in (−1/(n−1), 1).

    Returns:
      NumPy float64 λ in [0, 1].

    A ValueError refuses what :func:`equiangular_self_weight` refuses.
    """
    w = equiangular_self_weight(n, beta, rho)
    beta, rho = _equiangular_check(n, beta, rho)
    b = (1.0 - w) / (n - 1)
    a = w - b
    xs = 1.0 + (n - 1) * rho
    cross = 2 * a * b * xs + b * b * n * xs
    cos_out = (a * a * rho + cross) / (a * a + cross)
    return np.arccos(np.clip(cos_out, -1.0, 1.0)) / np.arccos(rho)


def cap_constant(d: int) -> float:
    r"""κ_d, the constant of the Poisson process of the keys nearest a query.

    n keys uniform on S^{d−1} at v = n^{2/(d−1)}(1 − ⟨q, y⟩) form a Poisson process of mean
    measure Λ(v) = κ_d v^{(d−1)/2} on [0, ∞) as n → ∞: P(1 − ⟨q, y⟩ ≤ u) = κ_d u^{(d−1)/2}(1 + O(u)), κ_d = 2^{(d−1)/2} Γ(d/2) / (√π (d−1)
    Γ((d−1)/2)).

    Args:
      d: the dimension of R^d (≥ 2).

    Returns:
      κ_d.

    A ValueError (:func:`critical_exponent`) refuses d not an integer ≥ 2.
    """
    critical_exponent(d)
    a = (d - 1) / 2
    return 2 ** a * math.exp(math.lgamma(d / 2) - math.lgamma(a)) / (math.sqrt(math.pi) * (d - 1))


def first_cluster_count(d: int, mode: int) -> float:
    r"""The number of clusters that form first when the fastest-growing mode is ``mode``.

    The clusters form at the maxima of the growing perturbation of the uniform density. On
    S¹ the fastest mode cos(k(θ − φ)) has k maxima: the count is k*. On S² the fastest
    degree l* leaves a random combination of the 2l* + 1 harmonics of that degree, whose
    expected number of local maxima is l(l + 1)/(2√3) (the expected number of critical points
    of a random spherical harmonic of degree l is (2/√3) l(l + 1) + O(1), a quarter of them
    maxima; Cammarota, Marinucci and Wigman). Both assume that one mode (one degree)
    dominates the perturbation when the clusters form; docs/math.md §I.4.

    Args:
      d: the dimension of R^d, 2 (S¹) or 3 (S²).
      mode: k* on S¹, l* on S² (≥ 1).

    Returns:
      The predicted count (a mean on S²).

    Raises:
      ValueError: d not 2 or 3, or mode < 1.
    """
    if d not in (2, 3):
        raise ValueError(f"first_cluster_count: d must be 2 (S¹) or 3 (S²), got {d!r}")
    if int(mode) != mode or mode < 1:
        raise ValueError(f"first_cluster_count: mode must be an integer >= 1, got {mode!r}")
    return float(mode) if d == 2 else mode * (mode + 1) / (2.0 * math.sqrt(3.0))


def mean_spacing(n: int, d: int) -> float:
    r"""The mean spacing h = (|S^{d−1}| / n)^{1/(d−1)} of n points on S^{d−1}.

    The side of the patch each point would own in an even spread (2π/n on S¹, √(4π/n) on S²).

    Args:
      n: the number of points (≥ 1).
      d: the dimension of R^d (≥ 2).

    Returns:
      h.

    Raises:
      ValueError: n < 1 or d not an integer ≥ 2.
    """
    critical_exponent(d)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (the number of points) must be an integer >= 1, got {n!r}")
    area = 2 * math.pi ** (d / 2) / math.gamma(d / 2)
    return (area / int(n)) ** (1.0 / (d - 1))


def cluster_graph_radius(n: int, d: int, factor: float = 1 / 3) -> float:
    r"""The chord radius r = ``factor`` · h of the cluster graph of n points (h: :func:`mean_spacing`).

    With ``factor`` = ⅓ the graph of a uniform cloud on S² is far below percolation (a point
    has on average n · πr²/(4π) = π/9 ≈ 0.35 neighbours; the disc graph of the plane
    percolates at ≈ 4.5): its components stay small (at n = 10⁶ the largest holds about 9
    points). Only the points a cluster has pulled together connect: a cluster of m points is
    one component once its points lie closer than r, while clusters at the predicted spacing
    s ≈ h √(n / count) stay apart (docs/math.md §I.4).

    Args:
      n: the number of points.
      d: the dimension of R^d.
      factor: r / h, > 0.

    Returns:
      r.

    A ValueError refuses what :func:`mean_spacing` refuses, or ``factor`` not > 0.
    """
    factor = _positive("factor", factor, "r / h")
    return factor * mean_spacing(n, d)


def _cloud(x, name="x"):
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[-1] < 2 or x.shape[-2] < 1 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{name} must be a floating (..., n, d) array of points (d >= 2, n >= 1), "
                         f"got dtype {x.dtype} shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} must be finite")
    return x


def graph_cluster_sizes(x, radius: float):
    """The component sizes of the graph of the points within chord distance ``radius``.

    Points i, j are joined when |x_i − x_j| ≤ r (on the unit sphere ⟨x_i, x_j⟩ ≥ 1 − r²/2: the
    graph of :func:`jaxdyn.clusters.cluster_masses` with δ = r²/2). All n points are used: a
    k-d tree lists the pairs (``scipy.spatial.cKDTree.query_pairs``), the components come from
    ``scipy.sparse.csgraph.connected_components``; time and memory grow with n plus the
    number of pairs.

    Args:
      x: (n, d) points (float32 or float64; the distances are taken in float64).
      radius: r > 0.

    Returns:
      (number of components,) int64 sizes, largest first (they sum to n).

    Raises:
      ValueError: ``x`` not a finite floating (n, d) array, or r not > 0.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    x = _cloud(x)
    if x.ndim != 2:
        raise ValueError(f"x must be one (n, d) cloud, got shape {x.shape}")
    r = _positive("radius", radius, "the graph's chord radius")
    n = x.shape[0]
    pairs = cKDTree(np.asarray(x, np.float64)).query_pairs(r, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return np.sort(np.bincount(labels))[::-1].astype(np.int64)


def graph_cluster_counts(xs, radius: float, min_size: int):
    """Cluster counts of clouds: components of the radius graph holding at least ``min_size`` points.

    Smaller components (stragglers between clusters, pairs of a uniform cloud that happen to
    lie close) are not counted; the fraction of the points the counted clusters hold says how
    far the cloud has broken up.

    Args:
      xs: (..., n, d) clouds (float32 or float64).
      radius: the chord radius r > 0 (:func:`cluster_graph_radius`).
      min_size: the fewest points of a counted cluster (an integer ≥ 1).

    Returns:
      ``(counts, fractions)``: (...) int64 counts and (...) float64 fractions of the n points
      in the counted clusters.

    Raises:
      ValueError: what :func:`graph_cluster_sizes` refuses, or ``min_size`` not an integer ≥ 1.
    """
    xs = _cloud(xs, "xs")
    if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 1:
        raise ValueError(f"min_size must be an integer >= 1, got {min_size!r}")
    flat = xs.reshape(-1, *xs.shape[-2:])
    counts, fractions = np.zeros(len(flat), np.int64), np.zeros(len(flat))
    for i, x in enumerate(flat):
        sizes = graph_cluster_sizes(x, radius)
        big = sizes[sizes >= min_size]
        counts[i], fractions[i] = big.size, big.sum() / x.shape[0]
    return counts.reshape(xs.shape[:-2]), fractions.reshape(xs.shape[:-2])


def _tail(log_front, order, start, shift):
    """exp(log_front + shift) Q(order, start), 0 where Q underflows."""
    from scipy.special import gammaincc

    q = float(gammaincc(order, start))
    return math.exp(log_front + shift + math.log(q)) if q > 0 else 0.0


def poisson_limit_weights(c: float, d: int, *, samples: int = 500, k: int = 5, seed: int = 0,
                          cutoff: float = 40.0, max_points: int = 200_000):
    """Samples of the limit law of the ordered weights at β = c n^{2/(d−1)} (n → ∞).

    With Γ_1 < Γ_2 < … the arrival times of a rate-1 Poisson process and v_j = (Γ_j/κ_d)^{2/a}
    (a = (d − 1)/2, :func:`cap_constant`), the ordered weights converge in law to
    W_(j) = e^{−c v_j}/Z, Z = Σ_j e^{−c v_j}. The points with c v_j ≤ ``cutoff`` (at most
    ``max_points``) are drawn; the rest of Z (and of the entropy's sum) is its mean,
    κ_d c^{−a} Γ(a + 1) Q(a, c V) (and of Σ c v W: κ_d a c^{−a} Γ(a + 1)
    Q(a + 1, c V)) with V the last drawn point (Q the regularised upper
    incomplete gamma function), an error below e^{−cutoff} relative to Z when the cutoff is
    reached.

    Args:
      c: the factor c > 0.
      d: the dimension of R^d (≥ 2).
      samples: the number of draws.
      k: the number of largest weights returned.
      seed: NumPy's seed.
      cutoff: the drawn points' largest c v.
      max_points: the most points drawn a sample.

    Returns:
      ``(weights (samples, k), entropy (samples,))``: the k largest weights in decreasing
      order and the entropy −Σ W log W.

    Raises:
      ValueError: c not finite > 0, d < 2, or sizes below 1.
    """
    c = _positive("c", c, "β = c n^(2/(d-1))")
    critical_exponent(d)
    if min(samples, k, max_points) < 1:
        raise ValueError(f"samples, k and max_points must be >= 1, got {samples}, {k}, {max_points}")
    a = (d - 1) / 2
    kappa = cap_constant(d)
    m = int(min(max_points, max(k, math.ceil(kappa * (cutoff / c) ** a * 1.2 + 10))))
    rng = np.random.default_rng(seed)
    out_w, out_h = np.empty((samples, k)), np.empty(samples)
    for s in range(samples):
        v = (np.cumsum(rng.exponential(size=m)) / kappa) ** (1 / a)
        cv = c * v
        e = np.exp(-(cv - cv[0]))  # relative to the nearest key (no underflow)
        tail_z = _tail(math.log(kappa) - a * math.log(c) + math.lgamma(a + 1), a, cv[-1], cv[0])
        tail_cv = _tail(math.log(kappa * a) - a * math.log(c) + math.lgamma(a + 1), a + 1,
                        cv[-1], cv[0])
        z = e.sum() + tail_z
        w = e / z
        # H = Σ W (c v − c v_1 + log Z), the tail's part from its mean measure
        h = np.sum(w * (cv - cv[0])) + (tail_cv - cv[0] * tail_z) / z + math.log(z)
        out_w[s], out_h[s] = w[:k], h
    return out_w, out_h
