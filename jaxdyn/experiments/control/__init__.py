"""Experiment kind ``control``: optimised depth-varying attention weights that push one cloud onto another.

Each grid point (``n_layers``, ``seed``) draws an initial cloud and a target cloud of
``n_particles`` points for ``problem``

* ``gaussian_to_mixture`` (R^2, the Euclidean model, weights Q, K, V, A, b): N(0, I) onto
  ``target.clusters`` Gaussian clusters of std ``target.spread`` centred on the circle of
  radius ``target.separation`` (two clusters: ±separation · e1);
* ``sphere_clusters`` (S^2, the sphere model, weights Q, K, V, β): the uniform measure onto
  ``target.clusters`` von Mises–Fisher clusters of concentration ``target.kappa`` (centres
  e1, e2, e3, then further points of a Fibonacci lattice),

and optimises layer-wise constant weights with :func:`jaxdyn.control.measure_control` (debiased
Sinkhorn divergence, Adam then L-BFGS, ε annealed). Recorded per point: the exact W2 of the
final cloud to the target (optimal assignment) and at the start, the Sinkhorn W2, the loss, W2
and ε histories, the status and why the optimiser stopped, the loss replayed at 4x the steps
(the optimisation must not exploit the discretisation), the clouds at several depths and the
controls against depth.

Figures: loss and W2 against iterations, W2 against depth L (log–log), the particles at
several depths, and the controls against depth as heat maps.
"""

from ..kinds import kind_exports
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, output_bytes, process_split

__getattr__, __all__ = kind_exports(__name__)
