"""Euler on the unprojected (ambient) field, then renormalise: x ← retract(x + dt·a(t, x)),
the published step of the rotf scripts (borjanG/2023-transformers-rotf), order 1."""

from typing import ClassVar

from ._base import AbstractIntegrator, resolve


def ambient_field(field):
    """The field's ambient extension ``a(t, x, args)``: the model's ``ambient`` method (for
    attention, V Σ_j w_ij x_j before the tangent projection P⊥(x)); a field without one on
    R^d is its own ambient field. A sphere field without ``ambient`` is an error (its
    unprojected form is not known)."""
    amb = getattr(field, "ambient", None)
    if amb is not None:
        return amb
    if getattr(field, "manifold", "euclidean") == "euclidean":
        return field
    raise ValueError(f"method 'euler_renormalise' needs the unprojected field: "
                     f"{type(field).__name__} has no ambient(t, x, args) method")


class EulerRenormalise(AbstractIntegrator):
    """x ← retract(x + dt·a(t, x)) with ``a`` the field *before* the tangent projection
    (:func:`ambient_field`). For attention with Q = K = V = I this is
    x ← normalise(x + h·softmax(β x xᵀ) x), the published phase-diagram step.

    On the sphere it is exactly projected Euler with the per-particle step
    dt/(1 + dt⟨x, a⟩): x + dt·a = (1 + dt s)(x + dt/(1 + dt s)·P⊥(x)a), s = ⟨x, a⟩
    (docs/math.md §F.4). So it differs from projected Euler by O(dt²) per step, is order 1,
    and runs a slower clock where s > 0 (inside clusters). |x| = 1 after each step on the
    sphere. In R^d it is plain Euler."""

    order: ClassVar[int] = 1

    def step(self, field, t, x, dt, args, geometry=None):
        return resolve(field, geometry).retract(x + dt * ambient_field(field)(t, x, args))
