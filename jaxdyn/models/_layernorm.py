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

from typing import ClassVar

import jax
import jax.numpy as jnp

from ..sphere import normalize, tangent_project
from ._fields import AbstractParticleModel

PLACEMENTS = ("postln", "preln", "periln", "ngpt")


def attention_output(field, t, x, args=None):
    """A_i(x): ``field.ambient`` (sphere attention models) or ``field`` itself (Euclidean)."""
    amb = getattr(field, "ambient", None)
    return amb(t, x, args) if amb is not None else field(t, x, args)


class AbstractNormPlacement(AbstractParticleModel):
    """A LayerNorm placement around an attention field (``field``)."""

    field: AbstractParticleModel
    placement: ClassVar[str]

    @property
    def dim(self) -> int:
        return self.field.dim

    @staticmethod
    def radius(z):
        """|z_i| row-wise (1 on the sphere placements)."""
        return jnp.linalg.norm(z, axis=-1)

    @staticmethod
    def direction(z):
        """z_i/|z_i|: the points the attention sees."""
        return normalize(z)


def _check_field(field):
    if not isinstance(field, AbstractParticleModel):
        raise ValueError(f"field must be a jaxdyn particle model (SphereAttention, "
                         f"EuclideanAttention, DepthAttention, ...), got {type(field).__name__}")
    return field


class PostLN(AbstractNormPlacement):
    """Post-LN: ẋ_i = P⊥(x_i) A_i(x) on the sphere (the engine's SphereAttention dynamics)."""

    manifold: ClassVar[str] = "sphere"
    placement: ClassVar[str] = "postln"

    def __init__(self, field):
        self.field = _check_field(field)

    def ambient(self, t, x, args=None):
        return attention_output(self.field, t, x, args)

    def __call__(self, t, x, args=None):
        return tangent_project(x, self.ambient(t, x, args))


class PreLN(AbstractNormPlacement):
    """Pre-LN: ż_i = A_i(z/|z|) in R^d (the radius r_i = |z_i| evolves)."""

    manifold: ClassVar[str] = "euclidean"
    placement: ClassVar[str] = "preln"

    def __init__(self, field):
        self.field = _check_field(field)

    def __call__(self, t, z, args=None):
        return attention_output(self.field, t, normalize(z), args)


class PeriLN(AbstractNormPlacement):
    """Peri-LN: ż_i = Â_i, Â = A/|A|, A evaluated at z/|z| (in R^d)."""

    manifold: ClassVar[str] = "euclidean"
    placement: ClassVar[str] = "periln"

    def __init__(self, field):
        self.field = _check_field(field)

    def __call__(self, t, z, args=None):
        return normalize(attention_output(self.field, t, normalize(z), args))


class NGPT(AbstractNormPlacement):
    """nGPT: ẋ_i = α P⊥(x_i) A_i/|A_i| on the sphere (α an array leaf)."""

    manifold: ClassVar[str] = "sphere"
    placement: ClassVar[str] = "ngpt"
    alpha: jax.Array

    def __init__(self, field, alpha=0.2):
        self.field = _check_field(field)
        dts = [l.dtype for l in jax.tree.leaves(field) if hasattr(l, "dtype")
               and jnp.issubdtype(l.dtype, jnp.floating)]
        self.alpha = jnp.asarray(alpha, jnp.result_type(*dts) if dts else None)
        if self.alpha.ndim != 0:
            raise ValueError(f"alpha must be a scalar, got shape {self.alpha.shape}")
        if not isinstance(self.alpha, jax.core.Tracer) and not bool(self.alpha > 0):
            raise ValueError(f"alpha (nGPT step size) must be > 0, got {float(self.alpha)}")

    def ambient(self, t, x, args=None):
        return self.alpha * normalize(attention_output(self.field, t, x, args))

    def __call__(self, t, x, args=None):
        return tangent_project(x, self.ambient(t, x, args))


_CLASSES = {"postln": PostLN, "preln": PreLN, "periln": PeriLN, "ngpt": NGPT}


def layer_norm(field, placement: str = "postln", **kw) -> AbstractNormPlacement:
    """The placement ``"postln" | "preln" | "periln" | "ngpt"`` around ``field`` (``alpha``
    for nGPT). Pre-/peri-LN states live in R^d: start them from unit rows (r = 1)."""
    if placement not in _CLASSES:
        raise ValueError(f"placement (norm) must be one of {PLACEMENTS}, got {placement!r}")
    if kw and placement != "ngpt":
        raise ValueError(f"placement {placement!r} takes no options, got {sorted(kw)}")
    return _CLASSES[placement](field, **kw)
