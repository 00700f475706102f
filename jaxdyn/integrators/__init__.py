"""The integrator set: fixed-step schemes and the tableaus of the adaptive pairs.

The fixed-step schemes (one a file) are diffrax solvers on the geometry they are given; the
adaptive pairs (Dormand–Prince 8(7), Rodas5) come with their tableaus and their step.
"""

from ._base import (
    AbstractIntegrator as AbstractIntegrator,
    GridInterpolation as GridInterpolation,
    GridODETerm as GridODETerm,
    scheme_step as scheme_step,
)
from ._geometry import (
    GEOMETRIES as GEOMETRIES,
    Euclidean as Euclidean,
    Sphere as Sphere,
    geometry_of as geometry_of,
)
from .euler import ProjectedEuler as ProjectedEuler
from .euler_renormalise import EulerRenormalise as EulerRenormalise, ambient_field as ambient_field
from .exp_euler import ExpEuler as ExpEuler
from .geodesic_em import GeodesicEulerMaruyama as GeodesicEulerMaruyama
from .rk4 import ProjectedRK4 as ProjectedRK4

#: the fixed-step schemes of ``jaxdyn.simulate`` by name
INTEGRATORS = {
    "euler": ProjectedEuler,
    "rk4": ProjectedRK4,
    "exp_euler": ExpEuler,
    "euler_renormalise": EulerRenormalise,
}

__all__ = ["AbstractIntegrator", "ProjectedEuler", "EulerRenormalise", "ambient_field",
           "ProjectedRK4", "ExpEuler", "GeodesicEulerMaruyama", "INTEGRATORS", "Euclidean",
           "Sphere", "GEOMETRIES", "geometry_of", "GridODETerm", "GridInterpolation",
           "scheme_step"]
