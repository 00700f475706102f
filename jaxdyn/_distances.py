r"""Wasserstein-2 distances between particle clouds and between Gaussians.

Four ways to measure W2, each with its bias stated (MATH.md, "Wasserstein distances
between particle clouds"):

- :func:`w2_exact` -- optimal assignment (``scipy.optimize.linear_sum_assignment``) between
  two clouds of equal size with uniform weights. No bias; O(N^3) time and an N x N cost
  matrix in memory: the reference for N up to a few thousand.
- :func:`w2_coupling` -- the cost of the *given* pairing, ``(1/N Σ_i |x_i - y_i|^2)^{1/2}``.
  An upper bound (W2 <= coupling), free, jittable. Natural for ``y = Π(x0)``.
- :func:`w2_sinkhorn` -- the debiased Sinkhorn divergence of ott-jax,
  ``S_ε = OT_ε(x, y) - ½ OT_ε(x, x) - ½ OT_ε(y, y)``, and ``W2 ≈ sqrt(max(S_ε, 0))``.
  Biased at finite ε (the debiasing removes the O(ε log ε) entropic offset but not all of
  it): the relative error grows with ε / W2^2. The default ε therefore follows the scale
  of the distance being measured (ε-scaling, see :func:`w2_sinkhorn`). Scales to large N
  with an online (``batch_size``) geometry whose memory is O(N · batch_size).
- :func:`bures_w2` -- the closed form between Gaussians (MATH.md §B),
  ``W2^2 = |m0 - m1|^2 + tr(S0 + S1 - 2 (S1^{1/2} S0 S1^{1/2})^{1/2})``, with an eigh-based
  PSD square root (ott-jax 0.6's Bures cost is inaccurate for ill-conditioned covariances).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float

from ._kernels import _pad_rows

__all__ = [
    "w2",
    "w2_exact",
    "w2_coupling",
    "w2_sinkhorn",
    "SinkhornW2",
    "bures_w2",
    "bures_w2_squared",
    "sqrtm_psd",
    "trace_sqrtm_psd",
]


# --------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# exact and coupling
# --------------------------------------------------------------------------------------


def w2_exact(x: Float[Array, "n d"], y: Float[Array, "n d"]) -> float:
    r"""Exact W2 between two uniform clouds of equal size (optimal assignment).

        W2(x, y)^2 = min_σ (1/N) Σ_i |x_i - y_σ(i)|^2   (σ a permutation)

    For uniform weights and equal sizes the optimal plan is a permutation (Birkhoff), so
    the Hungarian-type solver ``scipy.optimize.linear_sum_assignment`` on the squared
    Euclidean cost gives W2 exactly. Computed in float64 on the host whatever the input
    dtype.

    Bias: none. Cost: O(N^3) time and an N x N float64 matrix (N = 5000: 200 MB, seconds to
    tens of seconds). Not jittable. Returns ``nan`` if either cloud has a non-finite entry.

    Raises:
      ValueError: if x or y is not (N, d), or if the sizes or dimensions differ.
    """
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    _check_pair(x, y, same_size=True)
    xn = np.asarray(x, dtype=np.float64)
    yn = np.asarray(y, dtype=np.float64)
    if not (np.all(np.isfinite(xn)) and np.all(np.isfinite(yn))):
        return float("nan")
    cost = cdist(xn, yn, metric="sqeuclidean")
    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].mean()))


def w2_coupling(x: Float[Array, "... n d"], y: Float[Array, "... n d"]) -> Float[Array, "..."]:
    r"""Cost of the natural (given) pairing: an upper bound on W2.

        C(x, y) = ( (1/N) Σ_i |x_i - y_i|^2 )^{1/2}  >=  W2(x, y)

    since the pairing i -> i is one admissible coupling. For particle dynamics the natural
    pairing is ``y_i = Π(x_i(0))`` against ``x_i(t)``. Jittable and differentiable; leading
    batch dimensions broadcast (e.g. a trajectory (T, N, d) against (N, d) gives (T,)).

    Bias: upward (equality iff the given pairing is optimal). Cost: O(N d).
    """
    x = _as_float_array(x)
    y = _as_float_array(y)
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(
            f"x and y must be point clouds of shape (..., N, d), got shapes {x.shape} and {y.shape}"
        )
    if x.shape[-2:] != y.shape[-2:]:
        raise ValueError(
            f"x and y must be paired clouds with the same (N, d), got shapes {x.shape} and {y.shape}"
        )
    return jnp.sqrt(jnp.mean(jnp.sum((x - y) ** 2, axis=-1), axis=-1))


# --------------------------------------------------------------------------------------
# Sinkhorn (ott-jax 0.6)
# --------------------------------------------------------------------------------------


def _annealed_epsilon_class():
    """An ott ``Epsilon`` scheduler whose start multiple ``init`` is a pytree leaf.

    ott's own ``Epsilon`` keeps ``init`` static, so each new start value would recompile;
    here both the target and the start are traced (ε-scaling without recompilation):
    ``ε(it) = max(init · decay^it, 1) · target``.
    """
    from ott.geometry import epsilon_scheduler

    @jtu.register_pytree_node_class
    class AnnealedEpsilon(epsilon_scheduler.Epsilon):
        def tree_flatten(self):
            return (self.target, self.init), {"decay": self.decay}

        @classmethod
        def tree_unflatten(cls, aux_data, children):
            return cls(children[0], init=children[1], **aux_data)

        def __repr__(self) -> str:
            return f"AnnealedEpsilon(decay={self.decay})"

    return AnnealedEpsilon


_ANNEALED_EPSILON = None


def _annealed_epsilon(target, init, decay):
    global _ANNEALED_EPSILON
    if _ANNEALED_EPSILON is None:
        _ANNEALED_EPSILON = _annealed_epsilon_class()
    return _ANNEALED_EPSILON(target, init=init, decay=decay)


#: the largest ε ratio crossed within one Sinkhorn solve (by annealing); larger drops are
#: split over several warm-started rounds.
_MAX_ROUND_RATIO = 100.0


def _sq_dists(u, v):
    """|u_i - v_j|^2 by differences (no |u|^2 + |v|^2 - 2 u.v cancellation, no matmul)."""
    return jnp.sum((u[:, None, :] - v[None, :, :]) ** 2, axis=-1)


#: key-block size of the online log-sum-exp (points of the other cloud per block).
_LSE_K_BLOCK = 512


def _lse_key_block() -> int:
    """Key block of the online geometry: cache-sized on CPU, 8x larger on accelerators."""
    return _LSE_K_BLOCK if jax.default_backend() == "cpu" else 8 * _LSE_K_BLOCK


def lse_tile(q, keys, pot, inv, carry):
    """One tile of the online log-sum-exp of ``(pot_k − |keys_k − q_i|^2) · inv``: folds the
    tile's terms into the running (maximum, rescaled sum) ``carry`` of every row q_i. The
    cost by differences, ``Σ_c (k_c − q_c)^2``; ``pot = −inf`` terms contribute nothing."""
    mx, s = carry
    d = q.shape[1]
    cost = (q[:, None, 0] - keys[None, :, 0]) ** 2
    for c in range(1, d):
        cost = cost + (q[:, None, c] - keys[None, :, c]) ** 2
    logits = (pot[None, :] - cost) * inv
    new = jnp.maximum(mx, jnp.max(logits, axis=1))
    ref = jnp.where(jnp.isfinite(new), new, jnp.zeros((), q.dtype))
    s = s * jnp.exp(mx - ref) + jnp.sum(jnp.exp(logits - ref[:, None]), axis=1)
    return new, s


def blocked_lse(pts, other, pot, eps, *, q_block: int = 1024, k_block: int = _LSE_K_BLOCK):
    r"""``eps · log Σ_k exp((pot_k − |other_k − p|^2) / eps)`` for every row ``p`` of ``pts``.

    The Sinkhorn kernel of the squared-Euclidean cost, computed tile by tile: rows in
    blocks of ``q_block``, the other cloud in blocks of ``k_block`` with a running maximum
    and a rescaled running sum (the online log-sum-exp of the attention kernels). Nothing
    of size N x M is ever formed: memory O(q_block · k_block), and the program (hence the
    compile time) does not grow with N or M. The cost is formed by differences,
    ``Σ_c (o_c − p_c)^2``, never as ``|o|^2 + |p|^2 − 2 o·p``: at the small ε of
    concentrated clouds (ε ~ 1e-6 against |x|^2 = 1) the cancellation of the expanded form
    would move the exponents by O(1).

    ``pot = −inf`` entries (and the padding of the last block) contribute nothing; a row
    whose terms are all ``−inf`` gives ``−inf``.
    """
    n, d = pts.shape
    m = other.shape[0]
    dtype = pts.dtype
    kb = max(1, min(int(k_block), m))
    qb = max(1, min(int(q_block), n))
    other_p, nk = _pad_rows(other, kb)
    pot_p, _ = _pad_rows(pot.astype(dtype), kb, value=-jnp.inf)
    other_p = other_p.reshape(nk, kb, d)
    pot_p = pot_p.reshape(nk, kb)
    inv = 1.0 / eps

    def rows(q):
        def step(carry, block):
            return lse_tile(q, block[0], block[1], inv, carry), None

        rb = q.shape[0]
        init = (jnp.full((rb,), -jnp.inf, dtype), jnp.zeros((rb,), dtype))
        (mx, s), _ = jax.lax.scan(step, init, (other_p, pot_p))
        return eps * (mx + jnp.log(s))

    if n <= qb:
        return rows(pts)
    pts_p, nq = _pad_rows(pts, qb)
    return jax.lax.map(rows, pts_p.reshape(nq, qb, d)).reshape(nq * qb)[:n]


def _online_point_cloud_class():
    """ott ``PointCloud`` whose online log-sum-exp is computed here, tile by tile.

    ott-jax 0.6's own online path (``PointCloud(batch_size=...)``) calls
    ``jax.interpreters.batching.is_vmappable``, which jax 0.10 removed, so it fails. This
    subclass keeps ott's solver and overrides only ``apply_lse_kernel`` (the one kernel the
    Sinkhorn loop, its error and its cost use) with :func:`blocked_lse`: ``batch_size``
    rows at a time against blocks of ``_LSE_K_BLOCK`` points of the other cloud on CPU (8
    times that on accelerators), memory O(batch_size · block). The signed, weighted form
    (``vec``, used by ott only to apply a transport plan, never by Sinkhorn) is computed a
    row block at a time.
    """
    from ott.geometry import pointcloud

    @jtu.register_pytree_node_class
    class OnlinePointCloud(pointcloud.PointCloud):
        def apply_lse_kernel(self, f, g, eps, vec=None, axis=0):
            if axis == 0:  # for each y_j: eps * lse_i((f_i - C_ij) / eps)
                pts, other, pot = self.y, self.x, f
            else:  # for each x_i: eps * lse_j((g_j - C_ij) / eps)
                pts, other, pot = self.x, self.y, g
            if vec is None:
                res = blocked_lse(pts, other, pot, eps, q_block=self.batch_size,
                                  k_block=_lse_key_block())
                return res, jnp.ones_like(res)

            def one(p):
                c = jnp.sum((other - p[None, :]) ** 2, axis=-1)
                return jax.nn.logsumexp((pot - c) / eps, b=vec, return_sign=True)

            res, sgn = jax.lax.map(one, pts, batch_size=self.batch_size)
            return eps * res, sgn

    return OnlinePointCloud


_ONLINE_POINT_CLOUD = None


def _online_geometry(x, y, epsilon, batch_size):
    global _ONLINE_POINT_CLOUD
    if _ONLINE_POINT_CLOUD is None:
        _ONLINE_POINT_CLOUD = _online_point_cloud_class()
    return _ONLINE_POINT_CLOUD(x, y, epsilon=epsilon, batch_size=batch_size)


def _anneal_length(decay: float) -> int:
    return int(math.ceil(math.log(_MAX_ROUND_RATIO) / math.log(1.0 / decay)))


@functools.partial(
    jax.jit,
    static_argnames=("threshold", "max_iterations", "batch_size", "decay", "momentum_start",
                     "block"),
)
def _debiased_round(x, y, eps, eps_start, init, a=None, b=None, sparse=None, *, threshold,
                    max_iterations, batch_size, decay, momentum_start, block=None):
    """One round: the three entropic problems at ``eps``, annealed from ``eps_start`` and
    warm-started from ``init`` = ((f_xy, g_xy), (f_xx, g_xx), (f_yy, g_yy)).

    ``a``, ``b``: weights (default uniform). ``sparse``: block neighbour lists
    ``(xy rows x, xy rows y, xx, yy)`` of the block-sparse geometry (clouds in leaf order,
    see :mod:`jaxdyn._multiscale`), ``block`` its leaf size; else dense (``batch_size``
    None) or online (``batch_size`` rows)."""
    from ott.geometry import geometry
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import acceleration, sinkhorn

    dtype = x.dtype
    n, m = x.shape[0], y.shape[0]
    if a is None:
        a = jnp.full((n,), 1.0 / n, dtype=dtype)
    if b is None:
        b = jnp.full((m,), 1.0 / m, dtype=dtype)
    eps = jnp.asarray(eps, dtype)
    start = jnp.maximum(jnp.asarray(eps_start, dtype) / eps, jnp.asarray(1.0, dtype))
    sched = _annealed_epsilon(eps, start, decay)
    # Fix the gauge of the (x, y) potentials (f + c, g - c is the same plan): a warm start
    # can carry an offset (f ≈ -0.56, g ≈ +0.56 seen after the multiscale ladder), and
    # the kernel result R_i ≈ ε log a_i - f_i then loses |f| · 2^-24 / ε of relative
    # accuracy in float32 -- at ε = 1e-5 more than the 1e-3 marginal threshold, so
    # Sinkhorn never met it. Centred, |f|, |g| are of the order of the cost.
    (f0, g0) = init[0]
    shift = 0.5 * (jnp.sum(jnp.where(a > 0, a * f0, 0.0)) - jnp.sum(jnp.where(b > 0, b * g0, 0.0)))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros((), dtype))
    init = ((f0 - shift, g0 + shift),) + tuple(init[1:])

    def geom(u, v, which):
        if sparse is not None:
            from ._multiscale import sparse_geometry

            nbr = {"xy": (sparse[0], sparse[1]), "xx": (sparse[2], sparse[2]),
                   "yy": (sparse[3], sparse[3])}[which]
            return sparse_geometry(u, v, sched, nbr[0], nbr[1], block)
        if batch_size is None:
            return geometry.Geometry(cost_matrix=_sq_dists(u, v), epsilon=sched)
        return _online_geometry(u, v, sched, batch_size)

    one = np.asarray(1.0, dtype)  # dtype-true constants: x64 mode must not promote f32 runs
    half = np.asarray(0.5, dtype)
    # (x, y): alternate updates, adaptive over-relaxation (Lehmann et al.) measured once the
    # annealing is over; it cuts the iterations at small ε by 10x on spread clouds.
    solver_xy = sinkhorn.Sinkhorn(
        threshold=threshold,
        max_iterations=max_iterations,
        momentum=acceleration.Momentum(start=momentum_start, value=one),
    )
    # (x, x), (y, y): symmetric updates averaged with weight 1/2, as ott's divergence does.
    solver_sym = sinkhorn.Sinkhorn(
        threshold=threshold,
        max_iterations=max_iterations,
        parallel_dual_updates=True,
        momentum=acceleration.Momentum(start=0, value=half),
    )
    out_xy = solver_xy(linear_problem.LinearProblem(geom(x, y, "xy"), a=a, b=b), init=init[0])
    out_xx = solver_sym(linear_problem.LinearProblem(geom(x, x, "xx"), a=a, b=a), init=init[1])
    out_yy = solver_sym(linear_problem.LinearProblem(geom(y, y, "yy"), a=b, b=b), init=init[2])
    div = out_xy.reg_ot_cost - 0.5 * (out_xx.reg_ot_cost + out_yy.reg_ot_cost)
    pots = ((out_xy.f, out_xy.g), (out_xx.f, out_xx.g), (out_yy.f, out_yy.g))
    converged = jnp.stack([out_xy.converged, out_xx.converged, out_yy.converged])
    n_iters = jnp.stack([out_xy.n_iters, out_xx.n_iters, out_yy.n_iters])
    return div, pots, converged, n_iters


class SinkhornW2(NamedTuple):
    """Result of :func:`w2_sinkhorn`.

    Attributes:
      value: the W2 estimate ``sqrt(max(divergence, 0))`` (``nan`` if the solve produced NaN).
      divergence: the debiased Sinkhorn divergence S_ε at the final ε (≈ W2^2; may be
        slightly negative at large ε or before convergence).
      epsilon: the final ε (absolute, in units of the squared-Euclidean cost).
      converged: all three entropic problems of the final round met ``threshold``.
      n_iters: Sinkhorn iterations of the (x, y) problem, summed over all rounds.
      epsilons: the ε of each round (the ε-scaling ladder).
      divergences: S_ε of each round.
      epsilon_floored: the rule ``ε = rel_epsilon · S_ε`` asked for an ε below the floor
        (``epsilon_floor``), so the final ε is larger than the rule wanted and the bias may
        exceed the usual one.
      geometry: ``"dense"``, ``"online"`` or ``"multiscale"`` (block-sparse, certified
        truncation, :mod:`jaxdyn._multiscale`).
      kernel_density: for ``"multiscale"``, the fraction of the N x M cost entries a kernel
        pass of the final round visited (1.0 for the other geometries).
    """

    value: float
    divergence: float
    epsilon: float
    converged: bool
    n_iters: int
    epsilons: tuple
    divergences: tuple
    epsilon_floored: bool
    geometry: str = "dense"
    kernel_density: float = 1.0


#: row block of the online geometry by platform: cache-sized tiles on CPU (measured: 1024
#: rows x 512 keys within noise of the best of 256-4096 x 256-1024 at N = 8192), large tiles
#: on accelerators, where every block step is a kernel launch.
ONLINE_ROW_BLOCK = {"cpu": 1024, "gpu": 16384}


#: ``multiscale="auto"`` uses the block-sparse solver beyond this many cost entries, in
#: dimension up to ``MULTISCALE_MAX_DIM`` (k-d leaves stay compact in low dimension only),
#: on CPU (its per-leaf loops are sequential; on a GPU the dense online kernel's large
#: tiles are the default until the sparse path has been measured there).
MULTISCALE_MIN_ENTRIES = 2**24
MULTISCALE_MAX_DIM = 6


def _default_multiscale(n: int, m: int, d: int) -> bool:
    return (n * m > MULTISCALE_MIN_ENTRIES and d <= MULTISCALE_MAX_DIM
            and jax.default_backend() == "cpu")


def _default_batch_size(n: int, m: int) -> Optional[int]:
    # Dense cost matrices up to 2^24 entries (64 MB in float32; on CPU dense is faster up to
    # there, measured at N = 1000-4000); beyond, the online geometry.
    if n * m <= 2**24:
        return None
    return ONLINE_ROW_BLOCK["cpu" if jax.default_backend() == "cpu" else "gpu"]


def w2_sinkhorn(
    x: Float[Array, "n d"],
    y: Float[Array, "m d"],
    *,
    epsilon: Optional[float] = None,
    rel_epsilon: float = 0.005,
    epsilon_floor: Optional[float] = None,
    threshold: float = 1e-3,
    max_iterations: int = 20_000,
    max_rounds: int = 8,
    decay: float = 0.9,
    batch_size: Union[int, None, str] = "auto",
    multiscale: Union[bool, str] = "auto",
) -> SinkhornW2:
    r"""W2 from the debiased Sinkhorn divergence (ott-jax), with ε following the distance.

        S_ε(x, y) = OT_ε(x, y) - ½ OT_ε(x, x) - ½ OT_ε(y, y),    W2 ≈ sqrt(max(S_ε, 0)),
        OT_ε(μ, ν) = min_P ⟨P, C⟩ + ε KL(P | μ⊗ν),   C_ij = |x_i - y_j|^2,

    uniform weights on each cloud (sizes may differ).

    **Choice of ε (the default).** The bias of S_ε is governed by ε relative to W2^2 (an
    ε fixed in absolute terms is far too large for the small W2 of concentrated clouds:
    atoms ±e1 against a 0.05-noisy copy, W2 ≈ 0.07, give 14 % error at ε = 1e-3). So the
    default is ε-scaling:

    1. start at ``ε0 = 0.05 · mean(C)`` (``mean(C) = var x + var y + |x̄ - ȳ|^2``, O(N));
    2. solve, read ``S = S_ε``; the rule asks for ``ε* = max(rel_epsilon · S, epsilon_floor)``;
    3. stop if ``ε <= ε*``; else go to ``max(ε*, ε / 100)``, warm-starting from the
       current potentials and annealing within the solve (``ε_k = max(init·decay^k, 1)·ε``).

    Since S_ε grows towards W2^2 as ε falls, the final ε satisfies ``ε <= rel_epsilon · W2^2``
    up to the floor. With ``rel_epsilon = 0.005`` the W2 error measured against
    :func:`w2_exact` on 1000-point clouds on S^2 was below 1 % for spread, separated and
    nearly-concentrated clouds (``tests/test_distances.py``).

    Bias: S_ε is an entropic quantity; debiased, it still differs from W2^2 at finite ε
    (usually below it). Report ``epsilon`` with the value. ``converged`` must be checked:
    at small ε Sinkhorn may need many iterations.

    Args:
      x, y: clouds (N, d) and (M, d), same d and dtype (the computation runs in x's dtype).
      epsilon: a fixed ε (absolute). Disables the rule; the solve is still annealed from ε0.
      rel_epsilon: the fraction of the estimated W2^2 used as ε.
      epsilon_floor: the smallest ε the rule may pick; default ``mean(C) · 1e-7`` in
        float64 and ``mean(C) · 2e-6`` in float32 (the log-sum-exp loses resolution below).
      threshold: Sinkhorn's stopping tolerance (L1 marginal violation).
      max_iterations: per round and per entropic problem.
      max_rounds: at most this many ε rounds.
      decay: the per-iteration annealing factor inside a round.
      batch_size: ``None`` for a dense N x M cost matrix, an int for an online
        geometry (the cost recomputed tile by tile, ``batch_size`` rows against blocks of
        the other cloud, see :func:`blocked_lse`: memory O(batch_size · block), and a
        compiled program that does not grow with N), or ``"auto"`` (dense up to 2^24
        entries, else online with ``ONLINE_ROW_BLOCK`` rows: 1024 on CPU, 16384 on
        accelerators). (The earlier online kernel formed ``batch_size`` x M rows at once;
        on an H200 its first call compiled for about 1 min at N = 30 000 and over 2.5 min
        at N = 100 000. The tiled kernel's program is the same at every N.)
        Ignored when the multiscale solver runs.
      multiscale: ``True`` for the multiscale, block-sparse solver
        (:mod:`jaxdyn._multiscale`: the large-ε part of the ladder on N/32 sub-block
        centroids, then kernels that visit only the blocks a certified bound keeps, the
        dropped terms weighing < 1.5e-8 of every row's sum); ``False`` for dense/online;
        ``"auto"`` (default): multiscale beyond 2^24 cost entries in dimension <= 6, on
        CPU (not yet measured on accelerators, where the online kernel stays the default). On
        concentrated clouds at small ε the kernels touch a few % of the N x M entries,
        which makes N = 10^5 a matter of minutes on a laptop CPU instead of hours.

    Cost: the number of Sinkhorn iterations grows as ε falls against the cost's range; for
    spread clouds W2^2 (hence ε) shrinks with N, so iterations grow with N (about 1 900 at N = 1000, 10 000 at
    N = 30 000 on S^2), while concentrated clouds need a few hundred at any N.

    Returns:
      :class:`SinkhornW2`. The outer ε loop is Python; each round is one jitted call whose
      ε values are traced (no recompilation as ε changes).
    """
    _check_pair(x, y, same_size=False)
    x = _as_float_array(x)
    y = jnp.asarray(y, dtype=x.dtype)
    n, m = x.shape[0], y.shape[0]
    if multiscale not in ("auto", True, False):
        raise ValueError(f"multiscale must be 'auto', True or False, got {multiscale!r}")
    use_multiscale = (_default_multiscale(n, m, x.shape[1]) if multiscale == "auto"
                      else bool(multiscale))
    if batch_size == "auto":
        batch_size = _default_batch_size(n, m)
    elif batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        raise ValueError(f"batch_size must be None, 'auto' or a positive int, got {batch_size!r}")
    geometry_name = ("multiscale" if use_multiscale
                     else "dense" if batch_size is None else "online")
    if not (0.0 < decay < 1.0):
        raise ValueError(f"decay must lie in (0, 1), got {decay}")
    if epsilon is not None and not epsilon > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    if not rel_epsilon > 0:
        raise ValueError(f"rel_epsilon must be positive, got {rel_epsilon}")

    is64 = x.dtype == jnp.float64
    xn = np.asarray(x, dtype=np.float64)
    yn = np.asarray(y, dtype=np.float64)
    mx, my = xn.mean(0), yn.mean(0)
    mean_cost = float(((xn - mx) ** 2).sum(1).mean() + ((yn - my) ** 2).sum(1).mean()
                      + ((mx - my) ** 2).sum())
    if not np.isfinite(mean_cost):
        nan = float("nan")
        return SinkhornW2(nan, nan, nan, False, 0, (), (), False)
    if mean_cost == 0.0:  # identical single-point clouds
        return SinkhornW2(0.0, 0.0, 0.0, True, 0, (), (), False)
    if epsilon_floor is None:
        epsilon_floor = mean_cost * (1e-7 if is64 else 2e-6)
    eps0 = 0.05 * mean_cost

    anneal = _anneal_length(decay)
    momentum_start = 10 * (anneal // 10 + 3)  # measured after the annealing is over
    kw = dict(threshold=float(threshold), max_iterations=int(max_iterations),
              batch_size=batch_size, decay=float(decay), momentum_start=momentum_start)

    def rule(eps, div):
        """The next ε, or None when the ladder is done."""
        if epsilon is not None:
            if eps <= float(epsilon):
                return None
            return max(float(epsilon), eps / _MAX_ROUND_RATIO)
        target = max(rel_epsilon * max(div, 0.0), epsilon_floor)
        if eps <= target * (1.0 + 1e-12):
            return None
        return max(target, eps / _MAX_ROUND_RATIO)

    if use_multiscale:
        from . import _multiscale

        res = _multiscale.w2_multiscale(
            x, y, eps0=eps0, rule=rule, epsilon=epsilon, max_rounds=max_rounds, **kw)
    else:
        zeros = lambda k: jnp.zeros((k,), x.dtype)  # noqa: E731
        init = ((zeros(n), zeros(m)), (zeros(n), zeros(n)), (zeros(m), zeros(m)))
        eps = eps0 if epsilon is None else max(float(epsilon), 0.0)

        def solve(eps, eps_prev, init):
            return _debiased_round(x, y, eps, eps_prev, init, **kw)

        res = _ladder(solve, eps, eps0, init, rule, max_rounds)
    eps, div, converged, n_total, eps_list, div_list, info = res
    floored = False
    if epsilon is None and div_list and np.isfinite(div):
        floored = rel_epsilon * max(div, 0.0) < epsilon_floor and eps <= epsilon_floor * (1 + 1e-12)
    value = float(np.sqrt(max(div, 0.0))) if np.isfinite(div) else float("nan")
    return SinkhornW2(value, div, float(eps), converged, n_total, tuple(eps_list),
                      tuple(div_list), bool(floored), info.get("geometry", geometry_name),
                      info.get("kernel_density", 1.0))


def _ladder(solve, eps, eps_prev, init, rule, max_rounds):
    """The ε ladder: solve at ``eps`` (annealed from ``eps_prev``), then ``rule(eps, div)``
    gives the next ε, until it says stop. Returns (eps, div, converged, xy iterations,
    ε list, divergence list, info with the final potentials)."""
    eps_list, div_list = [], []
    n_total = 0
    converged = False
    div = float("nan")
    pots = init
    for _ in range(max_rounds):
        div_j, new_pots, conv, iters = solve(eps, eps_prev, pots)
        div = float(div_j)
        converged = bool(np.all(np.asarray(conv)))
        n_total += int(np.asarray(iters)[0])
        eps_list.append(float(eps))
        div_list.append(div)
        if not np.isfinite(div):
            converged = False
            break
        pots = new_pots
        nxt = rule(eps, div)
        if nxt is None:
            break
        eps_prev, eps = eps, nxt
    else:
        converged = False  # ran out of rounds before ε settled
    return eps, div, converged, n_total, eps_list, div_list, {"pots": pots}


# --------------------------------------------------------------------------------------
# dispatcher
# --------------------------------------------------------------------------------------


def w2(x: Float[Array, "n d"], y: Float[Array, "m d"], method: str = "exact", **opts) -> float:
    r"""W2 between two point clouds (uniform weights), as a Python float.

    Methods and their bias:

    - ``"exact"``: optimal assignment, no bias, O(N^3); equal sizes only (:func:`w2_exact`).
    - ``"sinkhorn"``: debiased Sinkhorn divergence with ε following W2^2; biased at finite
      ε, scales to large N (:func:`w2_sinkhorn`, which also returns ε and the convergence
      flag; here a ``RuntimeWarning`` is raised when the solve did not converge).
    - ``"coupling"``: the cost of the pairing i -> i, an upper bound (:func:`w2_coupling`).

    ``opts`` go to the chosen function.
    """
    if method == "exact":
        if opts:
            raise ValueError(f"method='exact' takes no options, got {sorted(opts)}")
        return w2_exact(x, y)
    if method == "coupling":
        if opts:
            raise ValueError(f"method='coupling' takes no options, got {sorted(opts)}")
        _check_pair(jnp.asarray(x), jnp.asarray(y), same_size=True)
        return float(w2_coupling(x, y))
    if method == "sinkhorn":
        res = w2_sinkhorn(x, y, **opts)
        if not res.converged:
            warnings.warn(
                f"w2(method='sinkhorn') did not converge (epsilon={res.epsilon:.3g}, "
                f"{res.n_iters} iterations); the value {res.value:.6g} may be inaccurate. "
                "Use jaxdyn.w2_sinkhorn for the full result.",
                RuntimeWarning,
                stacklevel=2,
            )
        return res.value
    raise ValueError(f"method must be 'exact', 'sinkhorn' or 'coupling', got {method!r}")


# --------------------------------------------------------------------------------------
# Gaussians: Bures-Wasserstein
# --------------------------------------------------------------------------------------


def _sym(a):
    return 0.5 * (a + jnp.swapaxes(a, -1, -2))


def _eigh_psd(s):
    w, u = jnp.linalg.eigh(_sym(s))
    return jnp.maximum(w, 0.0), u


def _zero_cut(w):
    """Eigenvalues at or below d · eps · max(w) are treated as zero in the derivatives."""
    d = w.shape[-1]
    return d * jnp.finfo(w.dtype).eps * jnp.max(jnp.abs(w), axis=-1, keepdims=True)


@jax.custom_jvp
def sqrtm_psd(s: Float[Array, "... d d"]) -> Float[Array, "... d d"]:
    r"""Symmetric PSD square root ``R = U diag(sqrt(max(λ, 0))) Uᵀ`` from ``eigh``.

    The input is symmetrised first; negative rounding eigenvalues are clipped to 0.
    The derivative is the Daleckii-Krein formula for f = sqrt, well defined for repeated
    eigenvalues (unlike differentiating through eigh's eigenvectors):

        dR = U [ (Uᵀ dS U)_ij / (sqrt λ_i + sqrt λ_j) ] Uᵀ,

    with the entries where both λ_i, λ_j are (numerically) zero set to 0 (the derivative of
    sqrt is infinite there; 0 is the safe choice). Jittable, vmappable, batched over leading
    dimensions.
    """
    w, u = _eigh_psd(s)
    return (u * jnp.sqrt(w)[..., None, :]) @ jnp.swapaxes(u, -1, -2)


@sqrtm_psd.defjvp
def _sqrtm_psd_jvp(primals, tangents):
    (s,), (ds,) = primals, tangents
    w, u = _eigh_psd(s)
    r = jnp.sqrt(w)
    ut = jnp.swapaxes(u, -1, -2)
    out = (u * r[..., None, :]) @ ut
    w = jnp.where(w > _zero_cut(w), w, 0.0)
    r = jnp.sqrt(w)
    den = r[..., :, None] + r[..., None, :]
    ok = den > 0
    k = jnp.where(ok, 1.0 / jnp.where(ok, den, 1.0), 0.0)
    dout = u @ ((ut @ _sym(ds) @ u) * k) @ ut
    return out, dout


@jax.custom_jvp
def trace_sqrtm_psd(c: Float[Array, "... d d"]) -> Float[Array, "..."]:
    r"""``tr(C^{1/2}) = Σ_i sqrt(max(λ_i(C), 0))`` for symmetric PSD C (symmetrised first).

    Derivative ``d tr C^{1/2} = Σ_i (u_iᵀ dC u_i) / (2 sqrt λ_i)``, with numerically zero
    eigenvalues contributing 0 (safe at rank deficiency). It needs only eigenvalue
    derivatives, so repeated eigenvalues are fine.
    """
    w, _ = _eigh_psd(c)
    return jnp.sum(jnp.sqrt(w), axis=-1)


@trace_sqrtm_psd.defjvp
def _trace_sqrtm_psd_jvp(primals, tangents):
    (c,), (dc,) = primals, tangents
    w, u = _eigh_psd(c)
    out = jnp.sum(jnp.sqrt(w), axis=-1)
    ok = w > _zero_cut(w)
    g = jnp.where(ok, 0.5 / jnp.sqrt(jnp.where(ok, w, 1.0)), 0.0)
    dw = jnp.einsum("...ji,...jk,...ki->...i", u, _sym(dc), u)
    return out, jnp.sum(g * dw, axis=-1)


def _check_gaussian(mname, m, sname, s):
    if m.ndim < 1 or s.ndim < 2 or s.shape[-1] != s.shape[-2] or s.shape[-1] != m.shape[-1]:
        raise ValueError(
            f"{mname} must have shape (..., d) and {sname} shape (..., d, d) with the same d, "
            f"got {mname}: {m.shape}, {sname}: {s.shape}"
        )


def bures_w2_squared(
    m0: Float[Array, "... d"],
    S0: Float[Array, "... d d"],
    m1: Float[Array, "... d"],
    S1: Float[Array, "... d d"],
) -> Float[Array, "..."]:
    r"""Squared W2 between N(m0, S0) and N(m1, S1) (Bures-Wasserstein), clipped at 0.

        W2^2 = |m0 - m1|^2 + tr(S0) + tr(S1) - 2 tr((S1^{1/2} S0 S1^{1/2})^{1/2})

    with eigh-based square roots (:func:`sqrtm_psd`, :func:`trace_sqrtm_psd`), so it is
    accurate for ill-conditioned and singular (PSD) covariances, jittable, vmappable and
    differentiable (also at repeated eigenvalues, e.g. S1 = I). The smooth choice for a
    loss. Covariances are symmetrised; they must be PSD (not checked: a negative
    eigenvalue is clipped to 0).
    """
    m0, S0, m1, S1 = (jnp.asarray(a) for a in (m0, S0, m1, S1))
    _check_gaussian("m0", m0, "S0", S0)
    _check_gaussian("m1", m1, "S1", S1)
    if m0.shape[-1] != m1.shape[-1]:
        raise ValueError(f"m0 and m1 must have the same d, got {m0.shape} and {m1.shape}")
    r1 = sqrtm_psd(S1)
    cross = trace_sqrtm_psd(r1 @ S0 @ r1)
    tr = jnp.trace(S0, axis1=-2, axis2=-1) + jnp.trace(S1, axis1=-2, axis2=-1)
    val = jnp.sum((m0 - m1) ** 2, axis=-1) + tr - 2.0 * cross
    return jnp.maximum(val, 0.0)


def bures_w2(
    m0: Float[Array, "... d"],
    S0: Float[Array, "... d d"],
    m1: Float[Array, "... d"],
    S1: Float[Array, "... d d"],
) -> Float[Array, "..."]:
    r"""W2 between N(m0, S0) and N(m1, S1): the square root of :func:`bures_w2_squared`.

        W2^2 = |m0 - m1|^2 + tr(S0 + S1 - 2 (S1^{1/2} S0 S1^{1/2})^{1/2})   (MATH.md §B)

    Exact up to rounding (no bias). The square root is made safe at 0 (gradient 0 where the
    two Gaussians coincide instead of NaN). Note that near coincidence W2 is not smooth; use
    the squared form in losses.
    """
    sq = bures_w2_squared(m0, S0, m1, S1)
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)
