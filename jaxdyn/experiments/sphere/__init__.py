"""Experiment kind ``sphere``: attention dynamics on S^{d-1} across a β sweep.

Records, per grid point (β, seed, …): the mean pairwise inner product
``(1/(N(N−1))) Σ_{i≠j} ⟨x_i, x_j⟩ = (N|x̄|² − 1)/(N − 1)`` against t (1 when all particles
form one cluster); snapshots of the particles at a few times; and a per-point ``finite`` status.
With ``cluster_stats: true`` also, per saved frame, the pair fraction, the cluster count
(components and Gram rank) and E_β (``jaxdyn.clusters``).
Figures: particles on the sphere at those times for one β; mean inner product against t;
the β × t heat maps of the pair fraction and the cluster count. ``movie``: an animation of
the snapshots (``jaxdyn report DIR --movie``).
"""

from ..kinds import kind_exports
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, process_split, output_bytes

__getattr__, __all__ = kind_exports(__name__, lazy_extra={"movie": "figures"})
