"""The integrator set: fixed-step schemes (one a file) on the geometry they are given, and
the tableaus of the adaptive pairs (Dormand–Prince 8(7), Rodas5) with their step."""

from ._base import AbstractIntegrator
from ._geometry import GEOMETRIES, Euclidean, Sphere, geometry_of
from .euler import ProjectedEuler
from .euler_renormalise import EulerRenormalise, ambient_field
from .exp_euler import ExpEuler
from .rk4 import ProjectedRK4

INTEGRATORS = {
    "euler": ProjectedEuler,
    "rk4": ProjectedRK4,
    "exp_euler": ExpEuler,
    "euler_renormalise": EulerRenormalise,
}

__all__ = ["AbstractIntegrator", "ProjectedEuler", "EulerRenormalise", "ambient_field",
           "ProjectedRK4", "ExpEuler", "INTEGRATORS", "Euclidean", "Sphere", "GEOMETRIES",
           "geometry_of"]
