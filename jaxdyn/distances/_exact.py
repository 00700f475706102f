"""W2 between clouds without entropic bias.

The optimal assignment (exact) and the cost of a given pairing (coupling, an upper bound).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._checks import _as_float_array, pair_problem
from ._scale import _exponent, times_pow2, unit_frame_host, widen_half
from ._solution import W2Solution, closed_solution, is_traced, scaled_closed_solution


def w2_exact(x: Float[Array, "n d"], y: Float[Array, "n d"]) -> W2Solution:
    r"""Exact W2 between two uniform clouds of equal size (optimal assignment).

    .. math::

        W_2(x, y)^2 = \min_\sigma \frac1N \sum_i |x_i - y_{\sigma(i)}|^2
        \qquad (\sigma \text{ a permutation})

    For uniform weights and equal sizes the optimal plan is a permutation (Birkhoff), so
    the Hungarian-type solver ``scipy.optimize.linear_sum_assignment`` on the squared
    Euclidean cost gives W2 exactly. Computed in float64 on the host whatever the input
    dtype; the result's arrays take JAX's default float dtype (float64 under
    ``jax_enable_x64``, else float32).

    Bias: none (``bias_bound`` 0). Cost: O(N^3) time and an N x N float64 matrix (N = 5000:
    200 MB, seconds to tens of seconds). A cloud that is a single point mass (all its points
    equal) is answered in closed form, O(N): every coupling is then the independent one,
    ``W2^2 = mean_i |x_i − q|^2``.

    Scale: the clouds are centred and brought to unit size by powers of two before the
    solve (:mod:`jaxdyn.distances._scale`), and the result is reported in their units, so
    it is right at any scale whose W2 the result's dtype holds (W2(s x + c, s y + c) =
    s W2(x, y) to rounding, e.g. at s = 1e-20 or 1e20, or a shift of 1e6); a W2 that
    overflows is ``nonfinite``. ``divergence`` (W2^2) may overflow to inf, or underflow
    to 0, where W2 does not.

    Dtypes: any real input (float16 and bfloat16 included, with no warning): the solve is in
    float64 on the host.

    Host only: the assignment is a SciPy (C++) solver on NumPy arrays, with no JAX
    primitive, so ``w2_exact`` does not compose with ``jax.jit``, ``jax.vmap`` or
    ``jax.grad`` (a host callback would make the program unexportable for accelerators, and
    W2 is not differentiable where the optimal permutation changes). Under a transformation,
    use :func:`w2_sinkhorn` (differentiable, any sizes) or :func:`w2_coupling`.

    Args:
        x: a cloud of N points in dimension d (array or nested lists).
        y: a cloud of N points in dimension d.

    Returns:
        :class:`W2Solution` (``method="exact"``): ``value`` is W2, ``divergence`` W2^2;
        ``result`` is ``nonfinite`` (and the value NaN) if either cloud has a non-finite
        entry.

    Raises:
        ValueError: if x or y is not (N, d) (N, d >= 1) or holds complex numbers, or if the
            sizes or dimensions differ.
        TypeError: if x or y is traced (under ``jit``, ``vmap`` or ``grad``).
    """
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    problem = pair_problem(x, y, same_size=True)
    if problem:
        raise ValueError(problem)
    if is_traced(x, y):
        raise TypeError(
            "w2_exact runs SciPy's assignment solver on the host and does not compose with "
            "jax.jit, jax.vmap or jax.grad; call it on concrete arrays, or use w2_sinkhorn "
            "(jittable, differentiable) or w2_coupling under a transformation")
    xn = np.asarray(x, dtype=np.float64)
    yn = np.asarray(y, dtype=np.float64)
    if not (np.all(np.isfinite(xn)) and np.all(np.isfinite(yn))):
        return _exact_solution(np.asarray(np.nan), np.asarray(np.nan))
    xt, yt, e, x_point, y_point = unit_frame_host(xn, yn)
    if y_point:  # every coupling is the independent one: W2² = mean_i |x_i − q|²
        sq = float(np.mean(np.sum((xt - yt[0]) ** 2, axis=1)))
    elif x_point:
        sq = float(np.mean(np.sum((yt - xt[0]) ** 2, axis=1)))
    else:
        cost = cdist(xt, yt, metric="sqeuclidean")
        rows, cols = linear_sum_assignment(cost)
        sq = float(cost[rows, cols].mean())
    # back in the user's units in float64 (W2² may overflow where W2 does not)
    return _exact_solution(np.ldexp(np.sqrt(sq), e), np.ldexp(sq, 2 * e))


def w2_coupling(x: Float[Array, "... n d"], y: Float[Array, "... n d"]) -> W2Solution:
    r"""Cost of the natural (given) pairing: an upper bound on W2.

    .. math::

        C(x, y) = \Big(\frac1N \sum_i |x_i - y_i|^2\Big)^{1/2} \;\ge\; W_2(x, y)

    since the pairing i -> i is one admissible coupling. For particle dynamics the natural
    pairing is ``y_i = Π(x_i(0))`` against ``x_i(t)``. Jittable, vmappable and
    differentiable (the gradient of ``value`` is 0, not NaN, where x = y); leading batch
    dimensions broadcast (e.g. a trajectory (T, N, d) against (N, d) gives a result of
    batch shape (T,)).

    Bias: upward (equality iff the given pairing is optimal): ``bias_bound`` is
    ``divergence`` itself (``0 <= W2^2 <= C^2``). Cost: O(N d).

    Scale: per batch member, the differences are formed and squared after division by
    powers of two (exact), and the result is reported in the clouds' units: right at any
    scale whose C the dtype holds; a C that overflows is ``nonfinite`` (``divergence`` may
    overflow to inf, or underflow to 0, where C does not).

    Dtypes: float32 and float64 are computed in their dtype; float16 and bfloat16 are computed
    in float32 with a ``UserWarning`` (the result is float32).

    Args:
        x: clouds (..., N, d).
        y: clouds (..., N, d), broadcasting against x.

    Returns:
        :class:`W2Solution` (``method="coupling"``) of the broadcast batch shape: ``value``
        is C, ``divergence`` C^2; ``result`` is ``nonfinite`` where C is not finite.

    Raises:
        ValueError: if x or y is not (..., N, d) with N, d >= 1, or their (N, d) differ.

    A complex x or y is refused by a TypeError naming it.

    Warns:
        UserWarning: float16 or bfloat16 input (computed in float32).
    """
    x, y = widen_half([_as_float_array(x, "x"), _as_float_array(y, "y")], "w2_coupling")
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(
            f"x and y must be point clouds of shape (..., N, d), got shapes {x.shape} and {y.shape}"
        )
    if 0 in x.shape[-2:] or 0 in y.shape[-2:]:
        raise ValueError(f"x and y must hold at least one point of dimension d >= 1, got "
                         f"shapes {x.shape} and {y.shape}")
    if x.shape[-2:] != y.shape[-2:]:
        raise ValueError(
            f"x and y must be paired clouds with the same (N, d), got shapes {x.shape} and {y.shape}"
        )
    return _coupling(x, y)


@jax.jit
def _exact_solution(value, sq):
    """The result of :func:`w2_exact` from W2 and W2² (one program, not ten eager ops)."""
    return closed_solution(sq, 0.0, "exact", value=value)


@jax.jit
def _coupling(x, y):
    """:func:`w2_coupling` after its checks: one program a shape, inlined under a caller's jit.

    Per member, the differences are brought to unit size by powers of two (exact): first by
    the largest |entry| of the pair (so that ``x − y`` cannot overflow), then by the largest
    |difference|; the squared cost is formed at unit size and reported in the user's units.

    Returns:
        The :class:`W2Solution` of :func:`w2_coupling`.
    """
    xs, ys = jax.lax.stop_gradient(x), jax.lax.stop_gradient(y)
    big = jnp.maximum(jnp.max(jnp.abs(xs), axis=(-2, -1)), jnp.max(jnp.abs(ys), axis=(-2, -1)))
    a = _exponent(big)[..., None, None]
    diff = times_pow2(x, -a) - times_pow2(y, -a)
    spread = jnp.max(jnp.abs(jax.lax.stop_gradient(diff)), axis=(-2, -1))
    b = _exponent(spread)[..., None, None]
    sq = jnp.mean(jnp.sum(times_pow2(diff, -b) ** 2, axis=-1), axis=-1)
    return scaled_closed_solution(sq, (a + b)[..., 0, 0], "divergence", "coupling")
