r"""Particle vector fields ``field(t, x, args) -> dx/dt`` as equinox Modules.

Softmax attention on the sphere (Paper A), its zero-temperature limit (Eq. 3), attention plus
affine feed-forward in R^d (Paper B), whose parameters may be time-varying :class:`Control`\\ s;
multi-head attention with causal masks, ALiBi / RoPE positions, L2 or Sinkhorn weights; weights
that vary with depth; LayerNorm placements. Parameters are array leaves: ``vmap`` over a stack of
models is a parameter sweep. Every model can be built inside ``jax.jit`` from NumPy or traced
weights; ``model.invalid()`` flags traced parameters outside their domain (the drivers report it
as ``RESULTS.invalid_input``).
"""

from ..choices import ATTENTIONS as ATTENTIONS, PLACEMENTS as PLACEMENTS
from ._control import Control as Control
from ._fields import (
    AbstractAttentionModel as AbstractAttentionModel,
    AbstractParticleModel as AbstractParticleModel,
    AbstractQKVModel as AbstractQKVModel,
    AbstractSphereModel as AbstractSphereModel,
    EuclideanAttention as EuclideanAttention,
    SphereAttention as SphereAttention,
    ZeroTemperature as ZeroTemperature,
    stack_models as stack_models,
)
from ._heads import MultiHeadAttention as MultiHeadAttention
from ._layernorm import (
    NGPT as NGPT,
    AbstractNormPlacement as AbstractNormPlacement,
    PeriLN as PeriLN,
    PostLN as PostLN,
    PreLN as PreLN,
    attention_output as attention_output,
    layer_norm as layer_norm,
)
from ._params import Domain as Domain
from ._schedule import DepthAttention as DepthAttention, redrawn_weights as redrawn_weights

# every name imported above (the private modules start with an underscore)
__all__ = sorted(n for n in globals() if not n.startswith("_"))
