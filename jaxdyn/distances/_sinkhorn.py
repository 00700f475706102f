"""W2 by the debiased Sinkhorn divergence (ott-jax), with ε following W2² (ε-scaling)."""

from __future__ import annotations

from typing import Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._results import RESULTS, Solution, stat, code, from_codes, raise_if_failed

from ._checks import _as_float_array, _check_pair
from ._rounds import _debiased_round, _ladder, _anneal_length, _MAX_ROUND_RATIO


class SinkhornW2(Solution):
    """Result of :func:`w2_sinkhorn`: a :class:`jaxdyn.Solution` pytree of arrays (it can be
    returned from ``jax.jit``, stacked and ``vmap``-ed over; ``float(res.value)`` works).

    Attributes:
      value: the W2 estimate ``sqrt(max(divergence, 0))`` (``nan`` if the solve produced NaN).
      divergence: the debiased Sinkhorn divergence S_ε at the final ε (≈ W2^2; may be
        slightly negative at large ε or before convergence).
      epsilon: the final ε (absolute, in units of the squared-Euclidean cost).
      epsilons: (rounds,) the ε of each round (the ε-scaling ladder).
      divergences: (rounds,) S_ε of each round.
      epsilon_floored: bool; the rule ``ε = rel_epsilon · S_ε`` asked for an ε below the
        floor (``epsilon_floor``), so the final ε is larger than the rule wanted and the bias
        may exceed the usual one.
      result: :class:`jaxdyn.RESULTS`: ``successful`` (all three entropic problems of the
        final round met ``threshold``; ``converged`` is ``bool(ok)``), ``not_converged``, or
        ``nonfinite`` (NaN/inf in the clouds or the solve).
      stats: ``n_iters`` (Sinkhorn iterations of the (x, y) problem, summed over all
        rounds) and ``kernel_density`` (for ``"multiscale"``, the fraction of the N x M cost
        entries a kernel pass of the final round visited; 1.0 for the other geometries);
        also attributes of the same names.
      geometry: ``"dense"``, ``"online"`` or ``"multiscale"`` (block-sparse, certified
        truncation, :mod:`jaxdyn.distances._multiscale`); static.
    """

    value: Array
    divergence: Array
    epsilon: Array
    epsilons: Array
    divergences: Array
    epsilon_floored: Array
    result: RESULTS
    stats: dict
    geometry: str = eqx.field(static=True, default="dense")

    @property
    def converged(self) -> bool:
        """All three problems of the final round met ``threshold`` (``bool(self.ok)``)."""
        return bool(self.ok)

    n_iters = stat("n_iters")

    kernel_density = stat("kernel_density")


def _result(value, div, eps, converged, n_iters, eps_list, div_list, floored,
            geometry="dense", kernel_density=1.0) -> SinkhornW2:
    """A :class:`SinkhornW2` of arrays from the host values of the ε ladder: numpy float64
    (the ladder's own host values, so the numbers are those the Python floats were; numpy
    leaves go through jit/vmap like any array and compare with pytest.approx)."""
    f = lambda v: np.asarray(v, np.float64)  # noqa: E731
    if not (np.isfinite(value) and np.isfinite(div)):
        status = code(RESULTS.nonfinite)
    elif converged:
        status = code(RESULTS.successful)
    else:
        status = code(RESULTS.not_converged)
    return SinkhornW2(
        value=f(value), divergence=f(div), epsilon=f(eps),
        epsilons=f(np.asarray(eps_list, np.float64).reshape(-1)),
        divergences=f(np.asarray(div_list, np.float64).reshape(-1)),
        epsilon_floored=np.asarray(bool(floored)), result=from_codes(np.asarray(status)),
        stats={"n_iters": np.asarray(int(n_iters)),
               "kernel_density": f(kernel_density)},
        geometry=geometry)


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
    throw: bool = False,
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
    (usually below it). Report ``epsilon`` with the value. ``result`` (``ok``) must be
    checked: at small ε Sinkhorn may need many iterations (``not_converged``).

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
        (:mod:`jaxdyn.distances._multiscale`: the large-ε part of the ladder on N/32 sub-block
        centroids, then kernels that visit only the blocks a certified bound keeps, the
        dropped terms weighing < 1.5e-8 of every row's sum); ``False`` for dense/online;
        ``"auto"`` (default): multiscale beyond 2^24 cost entries in dimension <= 6, on
        CPU (not yet measured on accelerators, where the online kernel stays the default). On
        concentrated clouds at small ε the kernels touch a few % of the N x M entries,
        which makes N = 10^5 a matter of minutes on a laptop CPU instead of hours.
      throw: if True, raise ``RuntimeError`` with the status message when the result is not
        successful (``not_converged`` or ``nonfinite``); default False.

    Cost: the number of Sinkhorn iterations grows as ε falls against the cost's range; for
    spread clouds W2^2 (hence ε) shrinks with N, so iterations grow with N (about 1 900 at N = 1000, 10 000 at
    N = 30 000 on S^2), while concentrated clouds need a few hundred at any N.

    Returns:
      :class:`SinkhornW2` (a pytree of arrays). The outer ε loop is Python
      (so ``w2_sinkhorn`` itself is not jitted); each round is one jitted call whose ε
      values are traced (no recompilation as ε changes).
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
    for name, v in (("max_iterations", max_iterations), ("max_rounds", max_rounds)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not threshold > 0:
        raise ValueError(f"threshold (the marginal tolerance) must be positive, got {threshold}")
    if not rel_epsilon > 0:
        raise ValueError(f"rel_epsilon must be positive, got {rel_epsilon}")

    is64 = x.dtype == jnp.float64
    xn = np.asarray(x, dtype=np.float64)
    yn = np.asarray(y, dtype=np.float64)
    mx, my = xn.mean(0), yn.mean(0)
    mean_cost = float(((xn - mx) ** 2).sum(1).mean() + ((yn - my) ** 2).sum(1).mean()
                      + ((mx - my) ** 2).sum())
    def done(res):
        if throw:
            raise_if_failed(res, "w2_sinkhorn")
        return res

    if not np.isfinite(mean_cost):
        nan = float("nan")
        return done(_result(nan, nan, nan, False, 0, (), (), False, geometry_name))
    if mean_cost == 0.0:  # identical single-point clouds
        return done(_result(0.0, 0.0, 0.0, True, 0, (), (), False, geometry_name))
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
    return done(_result(value, div, float(eps), converged, n_total, eps_list, div_list,
                        bool(floored), info.get("geometry", geometry_name),
                        info.get("kernel_density", 1.0)))


def default_multiscale(n: int, m: int, d: int) -> bool:
    """Whether ``w2_sinkhorn(multiscale="auto")`` takes the block-sparse solver for clouds of
    sizes n, m in dimension d (on this backend)."""
    return _default_multiscale(n, m, d)


def default_batch_size(n: int, m: int) -> Optional[int]:
    """The online row block ``w2_sinkhorn(batch_size=None)`` uses for clouds of sizes n, m
    (None: a dense cost matrix)."""
    return _default_batch_size(n, m)
