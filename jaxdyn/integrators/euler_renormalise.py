"""Euler on the unprojected (ambient) field, then renormalise, order 1.

x ← retract(x + dt·a(t, x)): the published step of the rotf scripts
(borjanG/2023-transformers-rotf).
"""

from typing import ClassVar

from ._base import AbstractIntegrator


def ambient_field(field):
    """The field's ambient extension ``a(t, x, args)``.

    For attention it is the model's ``ambient`` method (V Σ_j w_ij x_j before the tangent
    projection P⊥(x)); a field on R^d without one is its own ambient field.

    Args:
      field: a particle model.

    Returns:
      The callable ``a(t, x, args)``.

    Raises:
      ValueError: a sphere field without ``ambient`` (its unprojected form is not known).
    """
    amb = getattr(field, "ambient", None)
    if amb is not None:
        return amb
    if getattr(field, "manifold", "euclidean") == "euclidean":
        return field
    raise ValueError(f"method 'euler_renormalise' needs the unprojected field: "
                     f"{type(field).__name__} has no ambient(t, x, args) method")


class EulerRenormalise(AbstractIntegrator):
    """Euler on the field *before* the tangent projection, then the retraction. Order 1.

        x_{n+1} = retract(x_n + dt a(t_n, x_n)),   a = :func:`ambient_field` (model)

    Its term holds the ambient field: ``jaxdyn.simulate`` puts ``field_of(model)`` (the
    model's ``ambient``) in it. For attention with Q = K = V = I this is
    x ← normalise(x + h·softmax(β x xᵀ) x), the published phase-diagram step.

    On the sphere it is exactly projected Euler with the per-particle step
    dt/(1 + dt⟨x, a⟩): x + dt·a = (1 + dt s)(x + dt/(1 + dt s)·P⊥(x)a), s = ⟨x, a⟩
    (docs/math.md §F.4). So it differs from projected Euler by O(dt²) per step, is order 1,
    and runs a slower clock where s > 0 (inside clusters). |x| = 1 after each step on the
    sphere. In R^d it is plain Euler.

    Attributes:
      geometry: the space (None: the model's).
    """

    scheme_order: ClassVar[int] = 1

    def field_of(self, model):
        """The model's ambient field (:func:`ambient_field`).

        Args:
          model: a particle model.

        Returns:
          ``a(t, x, args)``.
        """
        return ambient_field(model)

    def update(self, terms, t0, t1, y0, args):
        """``retract(y0 + dt a(t0, y0))`` (the term holds the ambient field ``a``)."""
        return self.space.retract(y0 + self.increment(terms, t0, t1, y0, args))
