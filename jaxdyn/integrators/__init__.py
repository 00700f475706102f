"""Fixed-step integrators, one a file, on a small abstract base."""

from ._base import AbstractIntegrator
from .euler import ProjectedEuler
from .exp_euler import ExpEuler
from .rk4 import ProjectedRK4

INTEGRATORS = {
    "euler": ProjectedEuler,
    "rk4": ProjectedRK4,
    "exp_euler": ExpEuler,
}

__all__ = ["AbstractIntegrator", "ProjectedEuler", "ProjectedRK4", "ExpEuler", "INTEGRATORS"]
