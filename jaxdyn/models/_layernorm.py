"""Normalisation placements: where LayerNorm sits around an attention field (docs/math.md §H.1).

Each placement is a model wrapping an attention field ``field`` whose *attention output*
A_i(x) is ``field.ambient(t, x)`` for sphere models (``SphereAttention``, ``ZeroTemperature``,
:class:`~jaxdyn.models.DepthAttention`: V Σ_j w_ij x_j before the tangent projection) and
``field(t, x)`` for Euclidean models (``EuclideanAttention``: the whole right-hand side).
LayerNorm is taken as the projection LN(z) = z/|z| onto the unit sphere (simuformer's
convention: no centring, no gain, radius 1). With x_i = z_i/|z_i| and A_i = A_i(x):

* post-LN (today's sphere, BERT):  ẋ_i = P⊥(x_i) A_i                       on S^{d−1}
* pre-LN (GPT-2):                  ż_i = A_i                                in R^d
  (polar form r_i = |z_i|: ṙ_i = ⟨x_i, A_i⟩, ẋ_i = P⊥(x_i) A_i / r_i: the radius evolves
  and slows the angular motion)
* peri-LN (LN before and after the block):  ż_i = A_i / |A_i|               in R^d
  (ṙ_i = ⟨x_i, Â_i⟩, ẋ_i = P⊥(x_i) Â_i / r_i,  Â = A/|A|)
* nGPT (normalised transformer):   ẋ_i = α P⊥(x_i) A_i / |A_i|               on S^{d−1}
  (α the eigen learning rate; simuformer's α = 0.2)

The attention weights always see the normalised directions x = z/|z|, so pre- and peri-LN
states are clouds in R^d (``manifold = "euclidean"``); ``radius(z)`` and ``direction(z)`` read
them back. ``|A_i| = 0`` (peri-LN, nGPT) is a 0/0: the state turns non-finite and the run is
flagged ``nonfinite``.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Mapping

import jax
import jax.numpy as jnp

from ..choices import PLACEMENTS
from ..sphere._geometry import _normalize as normalize  # (no rescaling in the layers)
from ._fields import AbstractParticleModel, AbstractSphereModel
from ._params import Domain, float_dtype, parameter


def attention_output(field, t, x, args=None):
    """The attention output A_i(x) of a field.

    Args:
      field: a particle model: sphere attention models give ``field.ambient`` (before the
        tangent projection), Euclidean ones the field itself.
      t: time.
      x: (N, d) points.
      args: passed on.

    Returns:
      (N, d) array A(x).
    """
    amb = getattr(field, "ambient", None)
    return amb(t, x, args) if amb is not None else field(t, x, args)


class AbstractNormPlacement(AbstractParticleModel):
    """A LayerNorm placement around an attention field (module docstring).

    A placement on the sphere is ẋ_i = P⊥(x_i) output(A_i(x)); one in R^d is
    ż_i = output(A_i(z/|z|)).

    Attributes:
      field: the attention field (a particle model); a field that is not one raises a
        ValueError when the placement is built.
      placement: class attribute, the placement's name (one of ``PLACEMENTS``).
    """

    field: AbstractParticleModel
    placement: ClassVar[str]

    def __check_init__(self):
        """Refuse a field that is not a jaxdyn particle model.

        Raises:
          ValueError: naming the field's type.
        """
        if not isinstance(self.field, AbstractParticleModel):
            raise ValueError(f"field must be a jaxdyn particle model (SphereAttention, "
                             f"EuclideanAttention, DepthAttention, ...), got "
                             f"{type(self.field).__name__}")

    @property
    def dim(self) -> int:
        """The dimension d of the field."""
        return self.field.dim

    @abc.abstractmethod
    def output(self, a):
        """The map the placement applies to the attention output A (after the block).

        Args:
          a: (N, d) attention output.
        """

    @staticmethod
    def radius(z):
        """|z_i| row-wise (1 on the sphere placements).

        Args:
          z: (N, d) states.

        Returns:
          (N,) radii.
        """
        return jnp.linalg.norm(z, axis=-1)

    @staticmethod
    def direction(z):
        """z_i/|z_i|: the points the attention sees.

        Args:
          z: (N, d) states.

        Returns:
          (N, d) unit rows.
        """
        return normalize(z)


class _SpherePlacement(AbstractNormPlacement, AbstractSphereModel):
    """A placement on the sphere: ẋ_i = P⊥(x_i) output(A_i(x))."""

    manifold: ClassVar[str] = "sphere"

    def ambient(self, t, x, args=None):
        """output(A(x)), the field before the tangent projection."""
        return self.output(attention_output(self.field, t, x, args))


class _RadialPlacement(AbstractNormPlacement):
    """A placement in R^d, the attention seeing the directions: ż_i = output(A_i(z/|z|))."""

    manifold: ClassVar[str] = "euclidean"

    def __call__(self, t, z, args=None):
        """ż = output(A(z/|z|)) for states z of shape (N, d), any radius."""
        return self.output(attention_output(self.field, t, normalize(z), args))


class PostLN(_SpherePlacement):
    """Post-LN: ẋ_i = P⊥(x_i) A_i(x) on the sphere (the engine's SphereAttention dynamics).

    Attributes:
      field: the attention field A (a particle model).
    """

    placement: ClassVar[str] = "postln"

    def output(self, a):
        """The attention output unchanged."""
        return a


class PreLN(_RadialPlacement):
    """Pre-LN: ż_i = A_i(z/|z|) in R^d (the radius r_i = |z_i| evolves and slows the angles).

    Attributes:
      field: the attention field A, seen at the directions z/|z|.
    """

    placement: ClassVar[str] = "preln"

    def output(self, a):
        """A itself: no norm after the block."""
        return a


class PeriLN(_RadialPlacement):
    """Peri-LN: ż_i = Â_i, Â = A/|A|, A evaluated at z/|z| (in R^d).

    Attributes:
      field: the attention field A; its output is normalised again after the block.
    """

    placement: ClassVar[str] = "periln"

    def output(self, a):
        """Â = A/|A|, row-wise."""
        return normalize(a)


class NGPT(_SpherePlacement):
    """nGPT: ẋ_i = α P⊥(x_i) A_i/|A_i| on the sphere (α an array leaf).

    Args:
      field: the attention field.
      alpha: the eigen learning rate α, finite and > 0 (simuformer's 0.2; a traced α <= 0 is
        reported by :meth:`invalid`).

    Raises:
      ValueError: if ``field`` is not a particle model, or for a concrete α that is not finite
        and > 0.
    """

    placement: ClassVar[str] = "ngpt"
    domains: ClassVar[Mapping[str, Domain]] = {"alpha": Domain("positive", 0, "nGPT step size")}
    alpha: jax.Array

    def __init__(self, field, alpha=0.2):
        self.field = field
        self.alpha = parameter(NGPT, "alpha", alpha, float_dtype(*jax.tree.leaves(field)))

    def output(self, a):
        """α A/|A|, row-wise."""
        return self.alpha * normalize(a)


_CLASSES = {"postln": PostLN, "preln": PreLN, "periln": PeriLN, "ngpt": NGPT}


def layer_norm(field, placement: str = "postln", **kw) -> AbstractNormPlacement:
    """The LayerNorm placement ``placement`` around ``field``.

    Pre-/peri-LN states live in R^d: start them from unit rows (r = 1).

    Args:
      field: the attention field (a particle model).
      placement: ``"postln"`` | ``"preln"`` | ``"periln"`` | ``"ngpt"``.
      **kw: ``alpha`` for nGPT; the other placements take no options.

    Returns:
      The placement model.

    Raises:
      ValueError: for an unknown placement, or options a placement does not take.
    """
    if placement not in _CLASSES:
        raise ValueError(f"placement (norm) must be one of {PLACEMENTS}, got {placement!r}")
    if kw and placement != "ngpt":
        raise ValueError(f"placement {placement!r} takes no options, got {sorted(kw)}")
    return _CLASSES[placement](field, **kw)
