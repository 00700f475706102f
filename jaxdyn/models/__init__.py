"""Particle vector fields ``field(t, x, args) -> dx/dt`` as equinox Modules: softmax attention
on the sphere (Paper A), its zero-temperature limit (Eq. 3), attention plus affine
feed-forward in R^d (Paper B), whose parameters may be time-varying :class:`Control`s;
multi-head attention with causal masks, ALiBi / RoPE positions, L2 or Sinkhorn weights.
Parameters are array leaves: ``vmap`` over a stack of models is a parameter sweep."""

from ._control import Control as Control
from ._fields import (
    AbstractParticleModel as AbstractParticleModel,
    AbstractQKVModel as AbstractQKVModel,
    EuclideanAttention as EuclideanAttention,
    SphereAttention as SphereAttention,
    ZeroTemperature as ZeroTemperature,
    stack_models as stack_models,
)
from ._layernorm import (
    NGPT as NGPT,
    PLACEMENTS as PLACEMENTS,
    AbstractNormPlacement as AbstractNormPlacement,
    PeriLN as PeriLN,
    PostLN as PostLN,
    PreLN as PreLN,
    attention_output as attention_output,
    layer_norm as layer_norm,
)
from ._schedule import DepthAttention as DepthAttention, redrawn_weights as redrawn_weights
from ._heads import ATTENTIONS as ATTENTIONS, MultiHeadAttention as MultiHeadAttention
