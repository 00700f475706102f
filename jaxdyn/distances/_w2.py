"""``w2``: one entry point to the cloud distances (exact, Sinkhorn, coupling)."""

from __future__ import annotations

from jaxtyping import Array, Float

from ._checks import pair_problem
from ._exact import w2_coupling, w2_exact
from ._sinkhorn import w2_sinkhorn
from ._solution import W2Solution

#: the methods of :func:`w2`
METHODS = ("exact", "sinkhorn", "coupling")


def w2(x: Float[Array, "n d"], y: Float[Array, "m d"], method: str = "exact", **opts) -> W2Solution:
    r"""W2 between two point clouds (uniform weights).

    .. math::

        W_2(μ, ν)^2 = \min_{P \in Π(μ, ν)} \sum_{ij} P_{ij} |x_i - y_j|^2

    Methods and their bias:

    - ``"exact"``: optimal assignment, no bias, O(N^3); equal sizes only; host only (does not
      compose with ``jit``/``vmap``/``grad``) (:func:`w2_exact`).
    - ``"sinkhorn"``: debiased Sinkhorn divergence with ε following W2^2; biased at finite
      ε, scales to large N; jittable, vmappable, differentiable (:func:`w2_sinkhorn`).
    - ``"coupling"``: the cost of the pairing i -> i, an upper bound; jittable
      (:func:`w2_coupling`).

    Every method centres and rescales the clouds before it solves and reports in their units
    (right at any scale whose W2 the dtype holds; an overflowing W2 is ``nonfinite``), and
    answers a cloud that is a single point mass in closed form (``"exact"``,
    ``"sinkhorn"``). Dtypes: float16 and bfloat16 are computed in float32 with a
    ``UserWarning`` (``"exact"``: in float64 on the host, as every input).

    Args:
        x: the first cloud (N, d).
        y: the second cloud (M, d) (M = N for ``"exact"`` and ``"coupling"``).
        method: ``"exact"`` (default), ``"sinkhorn"`` or ``"coupling"``.
        **opts: options of the chosen function (``"sinkhorn"`` only: those of
            :func:`w2_sinkhorn`, e.g. ``epsilon``, ``throw``).

    Returns:
        The chosen function's :class:`W2Solution`: the distance is ``.value`` (``float(sol)``
        for a concrete result), with ``divergence``, ``epsilon``, ``bias_bound`` and the
        status ``result`` (check ``sol.ok``: a Sinkhorn solve may not converge).

    Raises:
        ValueError: an unknown method, options for a method that takes none, or clouds of
            the wrong shapes (N, d >= 1) or of a complex dtype.
    """
    if method not in METHODS:
        raise ValueError(f"method must be 'exact', 'sinkhorn' or 'coupling', got {method!r}")
    if method != "sinkhorn" and opts:
        raise ValueError(f"method={method!r} takes no options, got {sorted(opts)}")
    if method == "exact":
        return w2_exact(x, y)
    if method == "coupling":
        problem = pair_problem(x, y, same_size=True)
        if problem:
            raise ValueError(problem)
        return w2_coupling(x, y)
    return w2_sinkhorn(x, y, **opts)
