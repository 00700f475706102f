"""Wasserstein-2 distances between particle clouds and between Gaussians.

Four ways to measure W2, each with its bias stated (docs/math.md §D, "Wasserstein distances
between particle clouds"), all returning one result type, :class:`W2Solution` (a pytree of
arrays: ``value``, ``divergence`` ≈ W2², ``epsilon``, ``bias_bound`` with
``|divergence - W2²| <= bias_bound``, the status ``result`` and ``stats``):

- :func:`w2_exact` -- optimal assignment (``scipy.optimize.linear_sum_assignment``) between
  two clouds of equal size with uniform weights. No bias; O(N^3) time and an N x N cost
  matrix in memory: the reference for N up to a few thousand. Host only (no ``jit``).
- :func:`w2_coupling` -- the cost of the *given* pairing, ``(1/N Σ_i |x_i - y_i|^2)^{1/2}``.
  An upper bound (W2 <= coupling), free, jittable. Natural for ``y = Π(x0)``.
- :func:`w2_sinkhorn` -- the debiased Sinkhorn divergence of ott-jax,
  ``S_ε = OT_ε(x, y) - ½ OT_ε(x, x) - ½ OT_ε(y, y)``, and ``W2 ≈ sqrt(max(S_ε, 0))``.
  Biased at finite ε (the debiasing removes the O(ε log ε) entropic offset but not all of
  it): the relative error grows with ε / W2^2. The default ε therefore follows the scale
  of the distance being measured (ε-scaling, see :func:`w2_sinkhorn`). Jittable,
  vmappable, differentiable; scales to large N with an online geometry (memory
  O(N · batch_size)) or, for concrete clouds in low dimension, a multiscale block-sparse
  solver.
- :func:`bures_w2` -- the closed form between Gaussians (docs/math.md §B.11),
  ``W2^2 = |m0 - m1|^2 + tr(S0 + S1 - 2 (S1^{1/2} S0 S1^{1/2})^{1/2})``, with an eigh-based
  PSD square root (ott-jax 0.6's Bures cost is inaccurate for ill-conditioned covariances);
  :func:`bures_w2_squared` is its smooth square (an array: the loss).

:func:`w2` dispatches to the cloud distances by ``method``.
"""

from ._bures import (
    bures_w2 as bures_w2,
    bures_w2_squared as bures_w2_squared,
    sqrtm_psd as sqrtm_psd,
    trace_sqrtm_psd as trace_sqrtm_psd,
)
from ._exact import w2_coupling as w2_coupling, w2_exact as w2_exact
from ._sinkhorn import (
    default_batch_size as default_batch_size,
    default_multiscale as default_multiscale,
    w2_sinkhorn as w2_sinkhorn,
)
from ._solution import W2Solution as W2Solution
from ._w2 import w2 as w2

__all__ = [
    "W2Solution",
    "bures_w2",
    "bures_w2_squared",
    "default_batch_size",
    "default_multiscale",
    "sqrtm_psd",
    "trace_sqrtm_psd",
    "w2",
    "w2_coupling",
    "w2_exact",
    "w2_sinkhorn",
]
