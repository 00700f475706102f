"""The one result type of the W2 family: :class:`W2Solution`."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._results import RESULTS, Solution, code, from_codes, stat, status_codes


class W2Solution(Solution):
    r"""A Wasserstein-2 distance with its error and convergence fields (a pytree of arrays).

    Every W2 function of :mod:`jaxdyn.distances` (:func:`~jaxdyn.distances.w2`,
    :func:`~jaxdyn.distances.w2_exact`, :func:`~jaxdyn.distances.w2_sinkhorn`,
    :func:`~jaxdyn.distances.w2_coupling`, :func:`~jaxdyn.distances.bures_w2`) returns one.
    It can be returned from ``jax.jit``, stacked and ``vmap``-ed over; under ``vmap`` (or for
    batched inputs) every array field carries the batch shape, one ``result`` code per member.
    The distance is ``sol.value``; ``float(sol)`` (and ``np.asarray(sol)``) read it too for a
    concrete result.

    Every field is in the units of the inputs (the functions solve at unit size and scale
    back): ``value`` in distance units, ``divergence``, ``epsilon`` and ``bias_bound`` in
    squared units; a squared field may overflow to inf (or underflow to 0) where ``value``
    is representable, and the status follows ``value`` (``nonfinite`` where it overflows).

    The true W2 lies in ``[sqrt(max(divergence - bias_bound, 0)), sqrt(divergence +
    bias_bound)]`` (exactly at convergence; for Sinkhorn the potentials' residual at
    ``threshold`` adds to it), i.e. ``|divergence - W2^2| <= bias_bound``.

    Attributes:
        value: the W2 estimate ``sqrt(max(divergence, 0))`` (``nan`` if the solve produced
            NaN or the input was not finite).
        divergence: the estimate of W2^2 behind ``value``: the squared cost of the optimal
            assignment (``"exact"``), of the given pairing (``"coupling"``), the closed form
            (``"bures"``), or the debiased Sinkhorn divergence S_ε (``"sinkhorn"``; may be
            slightly negative at large ε or before convergence).
        epsilon: the entropic regularisation ε of the final solve (absolute, in units of
            the squared-Euclidean cost); 0 for the unregularised methods.
        bias_bound: a bound on ``|divergence - W2^2|``: 0 for ``"exact"`` and ``"bures"``;
            ``divergence`` itself for ``"coupling"`` (an upper bound: ``0 <= W2^2 <=
            divergence``); ``ε log max(N, M)`` for ``"sinkhorn"`` (from ``0 <= OT_ε - W2^2
            <= ε log min(N, M)`` and ``0 <= OT_ε(x, x) <= ε log N``; the bias observed is
            usually far smaller).
        result: :class:`jaxdyn.RESULTS`: ``successful``, ``not_converged`` (Sinkhorn did not
            meet its tolerance, or its ε ladder ran out of rounds), ``nonfinite`` (NaN/inf in
            the input or the solve) or ``invalid_input`` (a traced option out of its range).
        stats: a dict of arrays: ``num_steps`` (Sinkhorn iterations of the (x, y) problem,
            summed over its rounds; 0 for the other methods) and, for ``"sinkhorn"``,
            ``num_rounds``, ``epsilons`` and ``divergences`` (the ε and S_ε of each round of
            the ε ladder, NaN after the last), ``epsilon_floored`` (the rule asked for an ε
            below ``epsilon_floor``: the bias may exceed the usual one) and
            ``kernel_density`` (the fraction of the N x M cost entries a kernel pass of the
            final round visited: below 1 for the multiscale solver only).
        method: ``"exact"``, ``"sinkhorn"``, ``"coupling"`` or ``"bures"`` (static).
        geometry: for ``"sinkhorn"``, ``"dense"``, ``"online"`` or ``"multiscale"``; else
            ``""`` (static).
    """

    value: Array
    divergence: Array
    epsilon: Array
    bias_bound: Array
    result: RESULTS
    stats: dict
    method: str = eqx.field(static=True, default="")
    geometry: str = eqx.field(static=True, default="")

    num_steps = stat("num_steps", "Sinkhorn iterations of the (x, y) problem (0 for the other "
                                  "methods): ``stats['num_steps']``.")

    @property
    def converged(self):
        """Bool array: which members are successful (the same as ``ok``)."""
        return self.ok

    def __float__(self) -> float:
        """The distance of a concrete, unbatched result as a Python float."""
        return float(self.value)

    def __array__(self, dtype=None, copy=None):
        """The distance of a concrete result as a NumPy array (``np.asarray(sol)``)."""
        return np.asarray(self.value, dtype=dtype)


def status_of(value, converged=True):
    """Result codes of W2 estimates (any shape; works traced).

    Returns:
        ``nonfinite`` where ``value`` is not finite, else ``not_converged`` where
        ``converged`` is False, else ``successful`` (int32 codes).
    """
    finite = jnp.isfinite(value)
    codes = jnp.where(finite, jnp.where(converged, code(RESULTS.successful),
                                        code(RESULTS.not_converged)),
                      code(RESULTS.nonfinite))
    return codes.astype(jnp.int32)


def safe_sqrt(sq):
    """``sqrt(max(sq, 0))`` with gradient 0 (not NaN) at 0 and NaN kept NaN."""
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), jnp.where(jnp.isnan(sq), sq, 0.0))


def closed_solution(divergence, bias_bound, method: str, codes=None, value=None) -> W2Solution:
    """A :class:`W2Solution` of an unregularised method from its (batched) W2^2 estimate.

    ``value`` (default ``sqrt(max(divergence, 0))``) may be given where W2 is representable
    but W2^2 is not; the status follows the value.

    Returns:
        The :class:`W2Solution` (ε 0, ``num_steps`` 0).
    """
    divergence = jnp.asarray(divergence)
    shape, dtype = divergence.shape, divergence.dtype
    value = safe_sqrt(divergence) if value is None else jnp.asarray(value, dtype)
    codes = status_of(value) if codes is None else codes
    return W2Solution(
        value=value, divergence=divergence, epsilon=jnp.zeros(shape, dtype),
        bias_bound=jnp.broadcast_to(jnp.asarray(bias_bound, dtype), shape),
        result=from_codes(codes), stats={"num_steps": jnp.zeros(shape, jnp.int32)},
        method=method)


def scaled_closed_solution(sq, e, bias_bound, method: str) -> W2Solution:
    """:func:`closed_solution` of clouds rescaled by ``2^-e``, reported in the user's units.

    Args:
        sq: W2^2 of the rescaled clouds (any batch shape).
        e: the int32 exponent of the scale (broadcasting against ``sq``).
        bias_bound: ``"zero"`` (0) or ``"divergence"`` (the bound is W2^2 itself).
        method: the method's name.

    Returns:
        The :class:`W2Solution`: value ``2^e sqrt(sq)``, divergence ``4^e sq`` (inf where it
        overflows while the value does not: the status follows the value).
    """
    from ._scale import times_pow2

    sq = jnp.asarray(sq)
    value = times_pow2(safe_sqrt(sq), e)
    div = times_pow2(times_pow2(sq, e), e)
    bound = div if bias_bound == "divergence" else 0.0
    return closed_solution(div, bound, method, value=value)


def unscale_solution(sol: W2Solution, e) -> W2Solution:
    """A :class:`W2Solution` of clouds rescaled by ``2^-e`` in the user's units.

    The distance is multiplied by ``2^e``; the squared quantities (``divergence``,
    ``epsilon``, ``bias_bound``, the per-round ``epsilons`` and ``divergences``) by ``4^e``.
    A value that is not representable in the user's units (it overflows) is ``nonfinite``;
    a squared quantity may overflow to inf while the value is finite.

    Returns:
        The rescaled :class:`W2Solution` (same method, geometry and stats keys).
    """
    from ._scale import times_pow2

    sq = lambda v: times_pow2(times_pow2(v, e), e)  # noqa: E731
    value = times_pow2(sol.value, e)
    codes = status_codes(sol.result)
    bad = ~jnp.isfinite(value) & jnp.isfinite(sol.value)
    codes = jnp.where(bad & (codes != code(RESULTS.invalid_input)), code(RESULTS.nonfinite),
                      codes)
    stats = dict(sol.stats)
    for key in ("epsilons", "divergences"):
        if key in stats:
            stats[key] = sq(stats[key])
    return W2Solution(value=value, divergence=sq(sol.divergence), epsilon=sq(sol.epsilon),
                      bias_bound=sq(sol.bias_bound), result=from_codes(codes), stats=stats,
                      method=sol.method, geometry=sol.geometry)


def is_traced(*values) -> bool:
    """Whether any of ``values`` is a tracer (under ``jit``, ``vmap`` or ``grad``)."""
    return any(isinstance(v, jax.core.Tracer) for v in values)
