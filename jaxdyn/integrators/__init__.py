"""The integrator set: fixed-step schemes (one a file) on the geometry they are given, and
the tableaus of the adaptive pairs (Dormand–Prince 8(7), Rodas5) with their step."""

from ._base import AbstractIntegrator
from ._geometry import GEOMETRIES, Euclidean, Sphere, geometry_of
from .euler import ProjectedEuler
from .exp_euler import ExpEuler
from .rk4 import ProjectedRK4

INTEGRATORS = {
    "euler": ProjectedEuler,
    "rk4": ProjectedRK4,
    "exp_euler": ExpEuler,
}

__all__ = ["AbstractIntegrator", "ProjectedEuler", "ProjectedRK4", "ExpEuler", "INTEGRATORS",
           "Euclidean", "Sphere", "GEOMETRIES", "geometry_of"]
