"""``w2``: one entry point to the cloud distances (exact, Sinkhorn, coupling)."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
from jaxtyping import Array, Float


from ._checks import _check_pair
from ._exact import w2_coupling, w2_exact
from ._sinkhorn import w2_sinkhorn


def w2(x: Float[Array, "n d"], y: Float[Array, "m d"], method: str = "exact", **opts) -> float:
    r"""W2 between two point clouds (uniform weights), as a Python float.

    Methods and their bias:

    - ``"exact"``: optimal assignment, no bias, O(N^3); equal sizes only (:func:`w2_exact`).
    - ``"sinkhorn"``: debiased Sinkhorn divergence with ε following W2^2; biased at finite
      ε, scales to large N (:func:`w2_sinkhorn`, which also returns ε and the status
      ``result``; here a ``RuntimeWarning`` is raised when the solve did not converge).
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
        if not bool(res.ok):
            warnings.warn(
                f"w2(method='sinkhorn') did not converge (status {res.names}, "
                f"epsilon={float(res.epsilon):.3g}, {int(res.n_iters)} iterations); the value "
                f"{float(res.value):.6g} may be inaccurate. {res.messages} "
                "Use jaxdyn.w2_sinkhorn for the full result.",
                RuntimeWarning,
                stacklevel=2,
            )
        return float(res.value)
    raise ValueError(f"method must be 'exact', 'sinkhorn' or 'coupling', got {method!r}")
