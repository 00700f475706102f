"""W2 by the debiased Sinkhorn divergence (ott-jax), with ε following W2² (ε-scaling)."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import check_integer
from .._results import (
    RESULTS,
    code,
    error_if_failed,
    from_codes,
    raise_if_failed,
    status_codes,
)
from ._checks import _as_float_array, pair_problem
from ._rounds import _MAX_ROUND_RATIO, _anneal_length, _round_body, dual_divergence
from ._scale import cloud_frame, point_mass_sq, times_pow2, widen_half
from ._solution import W2Solution, is_traced, safe_sqrt, status_of, unscale_solution

#: :func:`~jaxdyn.distances._solution.unscale_solution` as one program
_unscaled = jax.jit(unscale_solution)

#: row block of the online geometry by platform: cache-sized tiles on CPU, large tiles on
#: accelerators, where every block step is a kernel launch.
ONLINE_ROW_BLOCK = {"cpu": 1024, "gpu": 16384}


#: ``multiscale="auto"`` uses the block-sparse solver beyond this many cost entries, in
#: dimension up to ``MULTISCALE_MAX_DIM`` (k-d leaves stay compact in low dimension only),
#: on CPU (its per-leaf loops are sequential; on a GPU the dense online kernel's large
#: tiles are the default until the sparse path has been measured there).
MULTISCALE_MIN_ENTRIES = 2**24
MULTISCALE_MAX_DIM = 6

#: the rule's stopping slack: ε counts as reached at ``target · (1 + 1e-12)``.
_REACHED = 1.0 + 1e-12


def default_multiscale(n: int, m: int, d: int) -> bool:
    """Whether ``w2_sinkhorn(multiscale="auto")`` takes the block-sparse solver.

    Args:
        n: points of the first cloud.
        m: points of the second cloud.
        d: their dimension.

    Returns:
        True beyond ``MULTISCALE_MIN_ENTRIES`` cost entries (n · m) in dimension at most
        ``MULTISCALE_MAX_DIM`` on the CPU backend (for concrete clouds; traced clouds always
        take the dense or online geometry).
    """
    return (n * m > MULTISCALE_MIN_ENTRIES and d <= MULTISCALE_MAX_DIM
            and jax.default_backend() == "cpu")


def default_batch_size(n: int, m: int) -> Optional[int]:
    """The online row block that ``w2_sinkhorn(batch_size="auto")`` uses.

    Dense cost matrices up to 2^24 entries (64 MB in float32; on CPU dense is faster up to
    there, ``benchmarks/bench_w2.py``); beyond, the online geometry with
    ``ONLINE_ROW_BLOCK`` rows.

    Args:
        n: points of the first cloud, an integer >= 1 (else a ValueError names it).
        m: points of the second cloud, an integer >= 1 (else a ValueError names it).

    Returns:
        None (a dense N x M cost matrix) or the online geometry's row block.
    """
    check_integer("n (points of the first cloud)", n, minimum=1)
    check_integer("m (points of the second cloud)", m, minimum=1)
    if n * m <= 2**24:
        return None
    return ONLINE_ROW_BLOCK["cpu" if jax.default_backend() == "cpu" else "gpu"]


def _check_positive(name, v, allow_none=True):
    """ValueError unless the concrete option ``v`` is a finite positive number (None allowed)."""
    if v is None and allow_none:
        return
    if is_traced(v):
        return  # flagged through the result code (invalid_input)
    arr = np.asarray(v)
    if (arr.shape != () or not np.issubdtype(arr.dtype, np.number) or not float(arr) > 0
            or not math.isfinite(float(arr))):
        raise ValueError(f"{name} must be a positive number (finite), got {v!r}")


def _warn_vacuous_epsilon(x, y, epsilon: float, e: int = 0) -> None:
    """Warn when a fixed ε's bias bound ε·log max(N, M) reaches mean(C) (>= W2^2).

    mean(C) = var x + var y + |x̄ − ȳ|^2, computed on the host in float64, is the cost of the
    independent coupling, an upper bound of W2^2: a bias bound at least as large says nothing
    about W2 (S_ε then tends to |x̄ − ȳ|^2, the means' distance, as ε grows). The clouds and
    ε are those of the rescaled problem (scale 2^e); the message states them in the user's
    units.
    """
    xn, yn = np.asarray(x, np.float64), np.asarray(y, np.float64)
    mx, my = xn.mean(0), yn.mean(0)
    mean_cost = float(((xn - mx) ** 2).sum(1).mean() + ((yn - my) ** 2).sum(1).mean()
                      + ((mx - my) ** 2).sum())
    log_size = math.log(max(xn.shape[0], yn.shape[0]))
    bound = epsilon * log_size
    if math.isfinite(mean_cost) and mean_cost > 0 and bound >= mean_cost:
        user = lambda v: float(np.ldexp(v, 2 * e))  # noqa: E731
        warnings.warn(
            f"w2_sinkhorn: epsilon = {user(epsilon):.4g} is too large for these clouds: its bias "
            f"bound epsilon·log max(N, M) = {user(bound):.4g} exceeds mean(C) = "
            f"{user(mean_cost):.4g}, the independent coupling's cost (an upper bound of W2²), so "
            "the value is the entropic S_ε at this ε and says nothing about W2 (it tends to the "
            "distance of the means); leave epsilon=None (ε follows W2²) or pass an epsilon below "
            f"{user(mean_cost / log_size):.3g}", stacklevel=3)


def _unit_option(v, e, dtype):
    """An absolute option in squared units (ε, the ε floor) at the rescaled clouds' size, v / 4^e.

    Concrete values are rescaled on the host in float64 (a Python float), traced ones in JAX.

    Returns:
        None for None, else the rescaled value.
    """
    if v is None:
        return None
    if is_traced(v, e):
        return times_pow2(jnp.asarray(v, dtype), -2 * jnp.asarray(e, jnp.int32))
    return float(np.ldexp(float(np.asarray(v)), -2 * int(e)))


@functools.partial(jax.jit, static_argnames=("length", "geometry"))
def _point_mass_solution(xt, yt, x_point, y_point, *, length, geometry):
    """The :class:`W2Solution` of rescaled clouds one of which is a point mass (no solve).

    W2² in closed form (:func:`~jaxdyn.distances._scale.point_mass_sq`), no bias, ε 0, the
    stats of a ladder that ran no round (history NaN, of the path's ``length``).

    Returns:
        The :class:`W2Solution` at unit size (method ``"sinkhorn"``).
    """
    dtype = xt.dtype
    sq = point_mass_sq(xt, yt, x_point, y_point)
    zero = jnp.zeros((), dtype)
    hist = jnp.full((length,), jnp.nan, dtype)
    return W2Solution(
        value=safe_sqrt(sq), divergence=sq, epsilon=zero, bias_bound=zero,
        result=from_codes(status_of(sq)),
        stats={"num_steps": jnp.int32(0), "num_rounds": jnp.int32(0), "epsilons": hist,
               "divergences": hist, "epsilon_floored": jnp.zeros((), bool),
               "kernel_density": zero},
        method="sinkhorn", geometry=geometry)


def _merge_point_mass(sol, xt, yt, x_point, y_point):
    """``sol`` with the closed form where a traced cloud is a point mass (its solve was skipped).

    The solver ran on zero clouds there (no round: ε and the bias bound are 0); the value and
    the divergence are the closed form's, whose gradient is NaN-free on both sides of the
    ``where`` (the double-where: neither branch is evaluated at a singular point).

    Returns:
        The merged :class:`W2Solution` at unit size.
    """
    deg = x_point | y_point
    sq = point_mass_sq(xt, yt, x_point, y_point)
    div = jnp.where(deg, sq, sol.divergence)
    value = jnp.where(deg, safe_sqrt(sq), sol.value)
    codes = status_codes(sol.result)
    codes = jnp.where(deg & (codes != code(RESULTS.invalid_input)), status_of(sq), codes)
    return eqx.tree_at(lambda s: (s.value, s.divergence, s.result), sol,
                       (value, div, from_codes(codes)))


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
) -> W2Solution:
    r"""W2 from the debiased Sinkhorn divergence (ott-jax), with ε following the distance.

    .. math::

        S_ε(x, y) = OT_ε(x, y) - ½ OT_ε(x, x) - ½ OT_ε(y, y),  \qquad  W_2 ≈ \sqrt{\max(S_ε, 0)},

        OT_ε(μ, ν) = \min_P ⟨P, C⟩ + ε\, KL(P \,|\, μ⊗ν), \qquad  C_{ij} = |x_i - y_j|^2,

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
    (usually below it): ``|S_ε - W2^2| <= ε log max(N, M)`` (``bias_bound``; the error
    observed is far smaller). Report ``epsilon`` with the value. ``result`` (``ok``) must be
    checked: at small ε Sinkhorn may need many iterations (``not_converged``).

    **Transformations.** The whole ε ladder (rule included) is one program of traced values:
    ``w2_sinkhorn`` runs under ``jax.jit`` and ``jax.vmap`` (clouds and ``epsilon``,
    ``rel_epsilon``, ``epsilon_floor`` may be traced; a traced option out of range gives
    ``invalid_input``), and lowers for accelerators. ``jax.grad`` (and ``jax.jvp``) of
    ``divergence`` or ``value`` flows to the points: the gradient of S_ε at the final ε
    (Danskin: the dual cost at the optimal potentials, held fixed), ε being treated as a
    constant (the rule's dependence of ε on the points is not differentiated; pass
    ``epsilon`` to fix it). Its accuracy follows the marginal ``threshold``. Through the
    online geometry, reverse mode stores the kernel's N x M terms.

    Only concrete clouds can take the multiscale solver (its block selection runs on the
    host); traced clouds take the dense or online geometry at any size.

    **Scale.** Every path solves on the clouds centred (at the midpoint of their means) and
    divided by a power of two 2^e that brings them to unit size (exact divisions:
    :mod:`jaxdyn.distances._scale`); ``epsilon`` and ``epsilon_floor`` (absolute, in squared
    units) are divided by 4^e with them, and ``value`` (times 2^e), ``divergence``,
    ``epsilon``, ``bias_bound`` and the per-round ``epsilons`` and ``divergences`` (times
    4^e) are reported in the clouds' units. So ``w2_sinkhorn(s x + c, s y + c, epsilon=s² ε)``
    is ``s`` times ``w2_sinkhorn(x, y, epsilon=ε)`` to rounding at any scale the dtype holds
    (1e-20 to 1e20 in float32, 1e30 in float64; clouds shifted by 1e6 keep their digits). A
    W2 that overflows the dtype is ``nonfinite``; a squared quantity may overflow to inf (or
    underflow to 0) where W2 does not. The rescaling carries no gradient (it is exact for any
    fixed scale), so ``jax.grad`` is that of S_ε.

    **Point masses.** If either cloud is a single point mass (all its points equal), every
    coupling is the independent one and W2 has the closed form ``W2^2 = mean_i |x_i − q|^2``
    (``|p − q|`` for two point masses): it is returned with no solve, ``epsilon`` and
    ``bias_bound`` 0, ``successful``. Concrete clouds are checked on the host before any
    solve (10^5 points: about a second); traced ones take the closed form through a
    ``jnp.where`` (the solver then runs on zero clouds, no round; the gradient is that of
    ``var x + var y + |x̄ − ȳ|^2``, NaN-free on both sides).

    **Dtypes.** float32 and float64 clouds are solved in their dtype (y cast to x's);
    float16 and bfloat16 cannot hold the squared costs (float16 overflows beyond 65504) and
    are solved in float32 with a ``UserWarning``: the result is float32. Integers take the
    default float.

    Args:
        x: the first cloud (N, d) (array or nested lists); the computation runs in its
            float dtype (float32 for float16 and bfloat16).
        y: the second cloud (M, d), same d (cast to x's dtype).
        epsilon: a fixed ε (absolute). Disables the rule; the solve is still annealed from
            ε0. As in ott-jax, a fixed ε is honoured: the status reports the solve at that ε
            (``successful`` when its marginals met ``threshold``), and ``value`` is the
            entropic quantity at that ε, within ``bias_bound`` of W2^2. An ε whose
            ``bias_bound`` reaches mean(C) (the independent coupling's cost, >= W2^2) leaves
            that bound vacuous (the value tends to the distance of the means as ε grows):
            concrete inputs then warn (``UserWarning``, naming the ε to stay below); under a
            transformation compare ``bias_bound`` with ``divergence``.
        rel_epsilon: the fraction of the estimated W2^2 used as ε.
        epsilon_floor: the smallest ε the rule may pick; default ``mean(C) · 1e-7`` in
            float64 and ``mean(C) · 2e-6`` in float32 (the log-sum-exp loses resolution
            below).
        threshold: Sinkhorn's stopping tolerance (L1 marginal violation).
        max_iterations: per round and per entropic problem.
        max_rounds: at most this many ε rounds (the ladder of the multiscale solver may
            take more, each smaller).
        decay: the per-iteration annealing factor inside a round, in (0, 1).
        batch_size: ``None`` for a dense N x M cost matrix, an int for an online geometry
            (the cost recomputed tile by tile, ``batch_size`` rows against blocks of the
            other cloud, see :func:`jaxdyn.kernels.blocked_lse`: memory O(batch_size ·
            block), and a compiled program that does not grow with N), or ``"auto"``
            (:func:`default_batch_size`: dense up to 2^24 entries, else online with
            ``ONLINE_ROW_BLOCK`` rows, 1024 on CPU and 16384 on accelerators). Ignored when
            the multiscale solver runs.
        multiscale: ``True`` for the multiscale, block-sparse solver
            (:mod:`jaxdyn.distances._multiscale`: the large-ε part of the ladder on N/32
            sub-block centroids, then kernels that visit only the blocks a certified bound
            keeps, the dropped terms weighing < 1.5e-8 of every row's sum; concrete clouds
            only); ``False`` for dense/online; ``"auto"`` (default): multiscale for concrete
            clouds beyond 2^24 cost entries in dimension <= 6, on CPU
            (:func:`default_multiscale`). On concentrated clouds at small ε the kernels
            touch a few % of the N x M entries, which brings N = 10^5 within reach of a CPU
            (the benchmarks page, docs/benchmarks.md, records the times).
        throw: if True, a result that is not successful raises with its status message (a
            ``RuntimeError`` for concrete clouds, ``eqx.error_if`` at run time under a
            transformation); default False.

    Cost: the number of Sinkhorn iterations grows as ε falls against the cost's range; for
    spread clouds W2^2 (hence ε) shrinks with N, so iterations grow with N (thousands at
    N >= 1000 on S^2; ``benchmarks/bench_w2.py`` records them), while concentrated clouds
    need a few hundred at any N.

    Returns:
        :class:`W2Solution` (``method="sinkhorn"``; ``geometry`` ``"dense"``, ``"online"`` or
        ``"multiscale"``): ``value`` W2, ``divergence`` S_ε, ``epsilon`` the final ε,
        ``bias_bound``, ``result`` (``successful``: the three entropic problems of the final
        round met ``threshold`` and the rule was satisfied; ``not_converged``; ``nonfinite``:
        NaN/inf in the clouds or the solve; ``invalid_input``), ``stats``: ``num_steps``
        (Sinkhorn iterations of the (x, y) problem, all rounds), ``num_rounds``,
        ``epsilons``, ``divergences`` (per round, NaN after the last), ``epsilon_floored``,
        ``kernel_density``.

    Raises:
        ValueError: if x or y is not (N, d) / (M, d) with one d (N, M, d >= 1) or holds
            complex numbers, or an option is out of its range (concrete values), or
            ``multiscale=True`` with traced clouds.

    Warns:
        UserWarning: a concrete fixed ``epsilon`` whose bias bound ε·log max(N, M) reaches
            mean(C) (the value then says nothing about W2); float16 or bfloat16 clouds
            (solved in float32).
    """
    problem = pair_problem(x, y, same_size=False)
    if problem:
        raise ValueError(problem)
    x = _as_float_array(x, "x")
    x, y = widen_half([x, jnp.asarray(y, dtype=x.dtype)], "w2_sinkhorn")
    n, m, d = x.shape[0], y.shape[0], x.shape[1]
    if multiscale not in ("auto", True, False):
        raise ValueError(f"multiscale must be 'auto', True or False, got {multiscale!r}")
    if batch_size == "auto":
        batch_size = default_batch_size(n, m)
    elif batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                     or batch_size <= 0):
        raise ValueError(f"batch_size must be None, 'auto' or a positive int, got {batch_size!r}")
    if not isinstance(decay, (int, float)) or not (0.0 < decay < 1.0):
        raise ValueError(f"decay must be a number in (0, 1), got {decay!r}")
    for name, v in (("max_iterations", max_iterations), ("max_rounds", max_rounds)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if is_traced(threshold) or not threshold > 0:
        raise ValueError(f"threshold (the marginal tolerance) must be positive (a concrete "
                         f"number), got {threshold!r}")
    _check_positive("epsilon", epsilon)
    _check_positive("rel_epsilon", rel_epsilon, allow_none=False)
    _check_positive("epsilon_floor", epsilon_floor)

    traced = is_traced(x, y)
    if multiscale is True and traced:
        raise ValueError("multiscale=True needs concrete clouds (its block selection runs on the "
                         "host); under jit/vmap/grad use multiscale=False or 'auto'")
    use_multiscale = (not traced) and (default_multiscale(n, m, d) if multiscale == "auto"
                                       else bool(multiscale))
    # the clouds at unit size (centred, rescaled by 2^-e), ε and its floor likewise (÷ 4^e)
    if traced:
        xt, yt, e, x_point, y_point = cloud_frame(x, y)
    else:  # concrete values also inside a caller's jit (clouds closed over): read on the host
        with jax.ensure_compile_time_eval():
            xt, yt, e, x_point, y_point = cloud_frame(x, y)
    eps_t = _unit_option(epsilon, e, x.dtype)
    floor_t = _unit_option(epsilon_floor, e, x.dtype)
    if epsilon is not None and not traced and not is_traced(epsilon):
        _warn_vacuous_epsilon(xt, yt, eps_t, int(e))

    anneal = _anneal_length(decay)
    kw = dict(threshold=float(threshold), max_iterations=int(max_iterations),
              decay=float(decay), momentum_start=10 * (anneal // 10 + 3))  # after the annealing
    if not traced and (bool(x_point) or bool(y_point)):  # closed form, no solve
        if use_multiscale:
            from ._multiscale import fine_round_limit

            length, geometry = int(max_rounds) + fine_round_limit(int(max_rounds)), "multiscale"
        else:
            length, geometry = int(max_rounds), "dense" if batch_size is None else "online"
        sol = _point_mass_solution(xt, yt, x_point, y_point, length=length, geometry=geometry)
    elif use_multiscale:
        sol = _w2_multiscale(xt, yt, eps_t, rel_epsilon, floor_t, int(max_rounds), kw)
    else:
        opt = lambda v: jnp.asarray(0.0 if v is None else v, x.dtype)  # noqa: E731
        deg = x_point | y_point
        # a traced point mass: the solver runs on zero clouds (no round), the closed form
        # answers (concrete clouds never get here with a point mass)
        x_run = jnp.where(deg, jnp.zeros((), x.dtype), xt) if traced else xt
        y_run = jnp.where(deg, jnp.zeros((), x.dtype), yt) if traced else yt
        sol = _ladder_program(x_run, y_run, opt(eps_t), opt(rel_epsilon), opt(floor_t),
                              fixed=epsilon is not None, floor_given=epsilon_floor is not None,
                              max_rounds=int(max_rounds), batch_size=batch_size, **kw)
        if traced:
            sol = _merge_point_mass(sol, xt, yt, x_point, y_point)
    sol = _unscaled(sol, e)
    if throw:
        if is_traced(*jax.tree.leaves(sol)):
            sol = eqx.tree_at(lambda s: s.value, sol, error_if_failed(sol.value, sol.result))
        else:
            raise_if_failed(sol, "w2_sinkhorn")
    return sol


@functools.partial(jax.jit, static_argnames=(
    "fixed", "floor_given", "max_rounds", "threshold", "max_iterations", "batch_size", "decay",
    "momentum_start"))
def _ladder_program(x, y, epsilon, rel_epsilon, epsilon_floor, *, fixed, floor_given, max_rounds,
                    threshold, max_iterations, batch_size, decay, momentum_start):
    """The ε ladder of :func:`w2_sinkhorn` (dense or online geometry) as one program.

    A ``lax.while_loop`` over rounds (each :func:`~jaxdyn.distances._rounds._round_body`: the
    three problems at ε, annealed from the previous ε and warm-started from its potentials)
    whose rule is traced arithmetic, on the clouds with their gradient stopped; then S_ε at
    the final ε from the final potentials (:func:`dual_divergence`) carries the gradient to
    the points, its value being the ladder's own.

    Returns:
        The :class:`W2Solution` of :func:`w2_sinkhorn` (geometry ``"dense"`` or ``"online"``).
    """
    dtype = x.dtype
    n, m = x.shape[0], y.shape[0]
    xs, ys = jax.lax.stop_gradient(x), jax.lax.stop_gradient(y)
    mx, my = jnp.mean(xs, 0), jnp.mean(ys, 0)
    mean_cost = (jnp.mean(jnp.sum((xs - mx) ** 2, 1)) + jnp.mean(jnp.sum((ys - my) ** 2, 1))
                 + jnp.sum((mx - my) ** 2))
    is64 = dtype == jnp.float64
    floor = epsilon_floor if floor_given else mean_cost * (1e-7 if is64 else 2e-6)
    ok_opts = jnp.isfinite(rel_epsilon) & (rel_epsilon > 0)
    if floor_given:
        ok_opts &= jnp.isfinite(epsilon_floor) & (epsilon_floor > 0)
    if fixed:
        ok_opts &= jnp.isfinite(epsilon) & (epsilon > 0)
    eps0 = 0.05 * mean_cost
    # identical single-point clouds: W2 = 0 without a solve (their cost is the rounding of
    # the means, far below (8 u)^2 of the scale)
    scale = jnp.mean(jnp.sum(xs ** 2, 1)) + jnp.mean(jnp.sum(ys ** 2, 1))
    zero_cost = mean_cost <= (8 * jnp.finfo(dtype).eps) ** 2 * scale
    run = jnp.isfinite(mean_cost) & ~zero_cost & ok_opts
    kw = dict(threshold=threshold, max_iterations=max_iterations, batch_size=batch_size,
              decay=decay, momentum_start=momentum_start)

    def rule(eps, div):
        """(stop, next ε) after a round at ``eps`` with divergence ``div``."""
        if fixed:
            return eps <= epsilon, jnp.maximum(epsilon, eps / _MAX_ROUND_RATIO)
        target = jnp.maximum(rel_epsilon * jnp.maximum(div, 0.0), floor)
        return eps <= target * _REACHED, jnp.maximum(target, eps / _MAX_ROUND_RATIO)

    def body(c):
        k, eps, eps_prev, _, pots, _, _, iters, eps_hist, div_hist, _ = c
        div, new_pots, conv, it = _round_body(xs, ys, eps, eps_prev, pots, **kw)
        finite = jnp.isfinite(div)
        stop, nxt = rule(eps, div)
        stop = stop | ~finite
        pots = jax.tree.map(lambda p, q: jnp.where(finite, p, q), new_pots, pots)
        return (k + 1, jnp.where(stop, eps, nxt), jnp.where(stop, eps_prev, eps), eps, pots, div,
                jnp.all(conv) & finite, iters + it[0].astype(jnp.int32),
                eps_hist.at[k].set(eps), div_hist.at[k].set(div), stop)

    z = lambda k: jnp.zeros((k,), dtype)  # noqa: E731
    nan = jnp.asarray(jnp.nan, dtype)
    hist = jnp.full((max_rounds,), jnp.nan, dtype)
    start = epsilon if fixed else eps0
    init = (jnp.int32(0), start, eps0, nan, ((z(n), z(m)), (z(n), z(n)), (z(m), z(m))), nan,
            jnp.zeros((), bool), jnp.int32(0), hist, hist, ~run)
    (rounds, _, _, eps, pots, div, conv, iters, eps_hist, div_hist, stopped) = jax.lax.while_loop(
        lambda c: (c[0] < max_rounds) & ~c[-1], body, init)
    ran = rounds > 0
    # the value is the ladder's; the gradient that of S_ε at the final ε and potentials
    dual = dual_divergence(x, y, jnp.where(ran, eps, 1.0), pots, batch_size)
    div = jnp.where(ran & jnp.isfinite(div), div + (dual - jax.lax.stop_gradient(dual)), div)
    div = jnp.where(zero_cost & ok_opts, jnp.zeros((), dtype), div)
    eps = jnp.where(ran, eps, jnp.zeros((), dtype))
    converged = (conv & stopped) | zero_cost  # out of rounds before ε settled: not converged
    codes = jnp.where(ok_opts, status_of(div, converged), code(RESULTS.invalid_input))
    floored = jnp.zeros((), bool)
    if not fixed:
        floored = (ran & jnp.isfinite(div) & (rel_epsilon * jnp.maximum(div, 0.0) < floor)
                   & (eps <= floor * _REACHED))
    return W2Solution(
        value=safe_sqrt(div), divergence=div, epsilon=eps,
        bias_bound=eps * math.log(max(n, m)), result=from_codes(codes),
        stats={"num_steps": iters, "num_rounds": rounds, "epsilons": eps_hist,
               "divergences": div_hist, "epsilon_floored": floored,
               "kernel_density": jnp.ones((), dtype)},
        method="sinkhorn", geometry="dense" if batch_size is None else "online")


@functools.partial(jax.jit, static_argnames=("log_size",))
def _multiscale_solution(div, eps, converged, num_steps, num_rounds, epsilons, divergences,
                         floored, density, *, log_size):
    """The :class:`W2Solution` of the multiscale solver from its host values (one program)."""
    return W2Solution(
        value=safe_sqrt(div), divergence=div, epsilon=eps, bias_bound=eps * log_size,
        result=from_codes(status_of(div, converged)),
        stats={"num_steps": num_steps, "num_rounds": num_rounds, "epsilons": epsilons,
               "divergences": divergences, "epsilon_floored": floored,
               "kernel_density": density},
        method="sinkhorn", geometry="multiscale")


def _w2_multiscale(x, y, epsilon, rel_epsilon, epsilon_floor, max_rounds, kw) -> W2Solution:
    """W2 by the multiscale solver, for concrete clouds.

    Its ε ladder and block selection run on the host, with the rule of :func:`w2_sinkhorn`
    in float64.

    Returns:
        The :class:`W2Solution` of :func:`w2_sinkhorn` (geometry ``"multiscale"``).
    """
    from . import _multiscale

    dtype = x.dtype
    n, m = x.shape[0], y.shape[0]
    xn = np.asarray(x, dtype=np.float64)
    yn = np.asarray(y, dtype=np.float64)
    mx, my = xn.mean(0), yn.mean(0)
    mean_cost = float(((xn - mx) ** 2).sum(1).mean() + ((yn - my) ** 2).sum(1).mean()
                      + ((mx - my) ** 2).sum())

    # the per-round history padded with NaN to the most rounds the solver can take (coarse
    # ladder, then rounds on the points), so that the result is one program a dtype
    length = max_rounds + _multiscale.fine_round_limit(max_rounds)

    def done(div, eps, converged, n_iters=0, eps_list=(), div_list=(), floored=False,
             density=1.0):
        hist = lambda v: np.pad(np.asarray(v, dtype).reshape(-1), (0, length - len(v)),  # noqa: E731
                                constant_values=np.nan)
        return _multiscale_solution(
            np.asarray(div, dtype), np.asarray(eps, dtype), np.asarray(bool(converged)),
            np.asarray(n_iters, np.int32), np.asarray(len(eps_list), np.int32), hist(eps_list),
            hist(div_list), np.asarray(bool(floored)), np.asarray(density, dtype),
            log_size=math.log(max(n, m)))

    if not np.isfinite(mean_cost):
        return done(np.nan, np.nan, False)
    if mean_cost == 0.0:  # identical single-point clouds
        return done(0.0, 0.0, True)
    rel = float(rel_epsilon)
    if epsilon_floor is None:
        epsilon_floor = mean_cost * (1e-7 if dtype == jnp.float64 else 2e-6)
    floor = float(epsilon_floor)
    eps0 = 0.05 * mean_cost

    def rule(eps, div):
        """The next ε, or None when the ladder is done."""
        if epsilon is not None:
            if eps <= float(epsilon):
                return None
            return max(float(epsilon), eps / _MAX_ROUND_RATIO)
        target = max(rel * max(div, 0.0), floor)
        if eps <= target * _REACHED:
            return None
        return max(target, eps / _MAX_ROUND_RATIO)

    eps, div, converged, n_total, eps_list, div_list, info = _multiscale.w2_multiscale(
        x, y, eps0=eps0, rule=rule, epsilon=epsilon, max_rounds=max_rounds,
        batch_size=None, **kw)
    floored = (epsilon is None and bool(div_list) and np.isfinite(div)
               and rel * max(div, 0.0) < floor and eps <= floor * _REACHED)
    # (the ε of the last round solved: a ladder out of rounds has picked one more)
    return done(div, eps_list[-1] if eps_list else float(eps), converged, n_total, eps_list,
                div_list, floored, info.get("kernel_density", 1.0))
