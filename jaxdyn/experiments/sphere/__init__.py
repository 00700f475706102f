"""Experiment kind ``sphere``: attention dynamics on S^{d-1} across a β sweep.

Records, per grid point (β, seed, …): the mean pairwise inner product
``(1/(N(N−1))) Σ_{i≠j} ⟨x_i, x_j⟩ = (N|x̄|² − 1)/(N − 1)`` against t (1 when all particles
form one cluster); snapshots of the particles at a few times; and a per-point ``finite`` status.
Figures: particles on the sphere at those times for one β; mean inner product against t.
"""

from .figures import plot
from .run import run_points
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, output_bytes
from .summary import summarize

__all__ = ["SCHEMA", "BATCH_AXES", "check", "estimate_bytes", "output_bytes", "run_points",
           "summarize", "plot"]
