"""Experiment kind ``long_context``: attention at β = β(n), measured as the number of tokens grows.

``study: collapse``: ``queries`` fixed queries and n i.i.d. uniform keys on S^{d−1}, β = c
n^{2/(d−1)}: per query the largest weight, the entropy, the effective number of keys and the
rank of the top key (:func:`jaxdyn.kernels.weight_statistics`, distance logits), against c for
several d and n, beside the Poisson limit law of the weights
(:func:`jaxdyn.long_context.poisson_limit_weights`).

``study: phase``: one attention layer (V = I) on nearly equiangular tokens (pairwise inner
product ρ, dimension d), β = γ log n: the angle ratio λ
(:func:`jaxdyn.long_context.layer_angle_ratio`) over (ρ, γ), beside γ_c = 1/(1 − ρ) and the
closed form of exactly equiangular tokens.

``study: dynamics``: n uniform particles on S¹ (d = 2) or S² (d = 3) under the attention
dynamics at β = c n^{2/(d−1)}: the mean inner product and the cluster count against t, the
first clusters (count and time) beside the most unstable mode of the uniform density and its
growth rate (:mod:`jaxdyn.pde`). ``count: all`` counts every particle (the radius graph of
:func:`jaxdyn.long_context.graph_cluster_counts`: n up to 10⁶ on S²) and records the fraction
of the particles the counted clusters hold (``clustered_fraction``).

The resolved β of every point is recorded (``beta_resolved``).
"""

from ..kinds import kind_exports
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, process_split, output_bytes

__getattr__, __all__ = kind_exports(__name__)
