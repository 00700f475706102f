"""Experiment kind ``reachability``: steering N(m0, S0) to random Gaussian targets (Paper B).

Each grid point (``mode``, ``seed``, ``d``) draws a random target ``N(m1, S1)``
(:func:`jaxdyn.control.random_target`: ``m1 ~ mean_scale · N(0, I)``, eigenvalues of S1
log-uniform in ``[eig_min, eig_max]``, Haar eigenvectors) and optimises the controls of the
moment dynamics with :func:`jaxdyn.control.reach` in one of the modes

* ``all``: A, b, V, B free;  ``attention``: A = 0, b = 0 (only V, B);
* ``bounded``: all free with ‖u(t)‖_F ≤ ``bound`` for each control;
* ``energy``: all free, loss W2² + λ ∫ Σ‖u‖² dt, with λ continuation until reached.

Recorded per point: the verified final W2 (independent Dopri8 solve) and its mean and
covariance parts, reached (W2 < ``tol``), control energy, iterations, wall time, the
certificate's W2 and energy (the constructive solution, V = B = 0), the loss and W2
histories, the controls, and ``N(m(t), Σ(t))`` at ``n_save`` times. For the points selected by
``transfer`` the optimised controls also drive the finite-N particle system (RK4) and the
L-layer transformer (one Euler step a layer), and the cloud is compared with the target
(Bures W2 between empirical moments — from i.i.d. starts and from starts with exact initial
moments — and exact W2 against a target sample with its sampling floor).

Figures: covariance ellipses along the way (d = 2) or eigenvalues of Σ(t) (d > 2), loss
curves, control profiles, and transfer W2 against N and L.
"""

from ..kinds import kind_exports
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, process_split, output_bytes

__getattr__, __all__ = kind_exports(__name__)
