"""W2 between clouds without entropic bias: the optimal assignment (exact) and the cost of a
given pairing (coupling, an upper bound)."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


from ._checks import _as_float_array, _check_pair


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
    return _coupling_cost(x, y)


@jax.jit
def _coupling_cost(x, y):
    # one program a shape (eagerly: five small ones), inlined under a caller's jit
    return jnp.sqrt(jnp.mean(jnp.sum((x - y) ** 2, axis=-1), axis=-1))
