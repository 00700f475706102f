"""Multi-head attention on the sphere, with causal masks, ALiBi / RoPE positions and L2 or
Sinkhorn weights (issue 15): :class:`MultiHeadAttention`."""

from __future__ import annotations

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..kernels._attention import KERNELS, HIGHEST
from ..kernels._variants import MASKS, default_rope_freqs, heads_interaction, rope
from ..sphere import tangent_project
from ._fields import AbstractParticleModel, _as_array, _dtype_of, _is_concrete

ATTENTIONS = ("softmax", "l2", "sinkhorn")


class MultiHeadAttention(AbstractParticleModel):
    r"""Multi-head self-attention dynamics on S^{d−1} (docs/math.md §G):

        ẋ_i = P⊥(x_i) Σ_h V_h Σ_j w^h_ij x_j,
        w^h_ij ∝ exp(l^h_ij),   l^h_ij = β ⟨R_i Q_h x_i, R_j K_h x_j⟩ − α_h |i − j|

    (``attention="softmax"``), or ``l^h_ij = −β |R_i Q_h x_i − R_j K_h x_j|² − α_h |i − j|``
    (``"l2"``), or the softmax logits with doubly stochastic weights from
    ``sinkhorn_iters`` Sinkhorn sweeps (``"sinkhorn"``, entropic ε = 1/β). V_h absorbs the
    output projection. The particle index is the position: ``mask="causal"`` keeps j ≤ i;
    ``alibi`` (slopes α_h) biases the logits by −α_h |i − j|; ``rope`` (frequencies ω_c)
    rotates the coordinate pairs (2c, 2c+1) of Q_h x_i by the angle i ω_c (R_i). Heads are
    a vmapped axis of one kernel call (dense, or one blocked pass for all heads).

    With H = 1, no mask, no positions and softmax weights this is
    :class:`~jaxdyn.SphereAttention` with B = QᵀK (equal up to rounding).

    Args:
      Q, K: (H, p, d) (or (p, d): one head); V: (H, d, d) (or (d, d)).
      beta: inverse temperature β > 0 (array leaf).
      mask: ``"none"`` | ``"causal"``.
      alibi: ALiBi slopes α_h ≥ 0, (H,) or a scalar for every head; None: no bias.
      rope: RoPE frequencies, (p // 2,), or ``True`` for ``base^(−2c/p)`` (``rope_base``);
        None: no rotation.
      attention: ``"softmax"`` | ``"l2"`` | ``"sinkhorn"``; sinkhorn_iters: sweeps (≥ 1).
      kernel, k_block, q_block: as :class:`~jaxdyn.SphereAttention`.
    """

    manifold: ClassVar[str] = "sphere"
    Q: jax.Array
    K: jax.Array
    V: jax.Array
    beta: jax.Array
    alibi: Optional[jax.Array]
    rope: Optional[jax.Array]
    mask: str = eqx.field(static=True, default="none")
    attention: str = eqx.field(static=True, default="softmax")
    sinkhorn_iters: int = eqx.field(static=True, default=0)
    kernel: str = eqx.field(static=True, default="auto")
    k_block: Optional[int] = eqx.field(static=True, default=None)
    q_block: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, beta, *, mask="none", alibi=None, rope=None, rope_base=10000.0,
                 attention="softmax", sinkhorn_iters=5, kernel="auto", k_block=None,
                 q_block=None):
        dt = _dtype_of(*(a for a in (Q, K, V) if hasattr(a, "dtype")))
        Q, K, V = (_as_array(a, None if hasattr(a, "dtype") else dt) for a in (Q, K, V))
        Q, K, V = (a[None] if a.ndim == 2 else a for a in (Q, K, V))
        if Q.ndim != 3 or K.shape != Q.shape:
            raise ValueError(f"Q and K must have the same shape (H, p, d) (or (p, d)); got "
                             f"{Q.shape} and {K.shape}")
        H, p, d = Q.shape
        if V.shape != (H, d, d):
            raise ValueError(f"V must have shape ({H}, {d}, {d}) (one (d, d) value map a head, "
                             f"the output projection absorbed), got {V.shape}")
        self.Q, self.K, self.V = Q, K, V
        self.beta = jnp.asarray(beta, dtype=Q.dtype)
        if self.beta.ndim != 0:
            raise ValueError(f"beta must be a scalar, got shape {self.beta.shape}")
        if _is_concrete(self.beta):
            if not bool(self.beta > 0):
                raise ValueError(f"beta (inverse temperature) must be > 0, got {float(self.beta)}")
        if mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if attention == "sinkhorn":
            if isinstance(sinkhorn_iters, bool) or int(sinkhorn_iters) < 1:
                raise ValueError(f"sinkhorn_iters must be >= 1, got {sinkhorn_iters!r}")
            if mask == "causal":
                raise ValueError("attention='sinkhorn' takes no causal mask (a lower-triangular "
                                 "doubly stochastic matrix is the identity)")
        if alibi is not None:
            alibi = jnp.broadcast_to(jnp.asarray(alibi, Q.dtype), (H,))
            if _is_concrete(alibi) and not np.all(np.asarray(alibi) >= 0):
                raise ValueError(f"alibi slopes must be >= 0, got {alibi}")
        if rope is True:
            rope = default_rope_freqs(p, rope_base, Q.dtype)
        elif rope is not None:
            rope = jnp.asarray(rope, Q.dtype)
            if rope.shape != (p // 2,):
                raise ValueError(f"rope must hold p // 2 = {p // 2} frequencies, got shape "
                                 f"{rope.shape}")
        self.alibi, self.rope = alibi, rope
        self.mask, self.attention = mask, attention
        self.sinkhorn_iters = int(sinkhorn_iters) if attention == "sinkhorn" else 0
        self.kernel = kernel
        self.k_block = None if k_block is None else int(k_block)
        self.q_block = None if q_block is None else int(q_block)

    @property
    def dim(self) -> int:
        return self.Q.shape[2]

    @property
    def heads(self) -> int:
        return self.Q.shape[0]

    def head_averages(self, x):
        """``m_hi = Σ_j w^h_ij x_j`` for every head, (H, N, d)."""
        q = jnp.einsum("hpd,nd->hnp", self.Q, x, precision=HIGHEST)
        k = jnp.einsum("hpd,nd->hnp", self.K, x, precision=HIGHEST)
        if self.rope is not None:
            q, k = rope(q, self.rope), rope(k, self.rope)
        return heads_interaction(
            q, k, x, self.beta, alibi=self.alibi, causal=self.mask == "causal",
            logits="l2" if self.attention == "l2" else "dot",
            sinkhorn_iters=self.sinkhorn_iters, kernel=self.kernel, k_block=self.k_block,
            q_block=self.q_block)

    def ambient(self, t, x, args=None):
        """The field before the tangent projection, Σ_h V_h m_hi."""
        return jnp.einsum("hne,hde->nd", self.head_averages(x), self.V, precision=HIGHEST)

    def __call__(self, t, x, args=None):
        return tangent_project(x, self.ambient(t, x, args))
