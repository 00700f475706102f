"""Weights that vary with depth (docs/math.md §H.2): one multi-head attention set per layer,
piecewise constant in time.

    ẋ_i = P⊥(x_i) [ Σ_h V_{l,h} Σ_j w^{l,h}_ij x_j + c_l ],   l = l(t) = min(⌊t/τ⌋, L − 1),
    w^{l,h}_ij = softmax_j( β (⟨Q_{l,h} x_i, K_{l,h} x_j⟩ + ⟨u_{l,h}, x_j⟩) ).

Q_{l,h}, K_{l,h} are (k, d) (k = d for the square weights of Paper A, k = d/H = 32 for
MiniLM's heads), V_{l,h} is (d, d) (it absorbs the output projection), u_{l,h} a key-side
logit bias (the query bias of a trained model, K_{l,h}ᵀ b^Q_{l,h}; 0 by default) and c_l a
constant drift (the value and output biases; 0 by default). Layer l acts on [lτ, (l+1)τ).

Three sources: explicit per-layer arrays (``DepthAttention(Q, K, V, beta, period)``), an
ensemble redrawn every period as rotf's ``--regen_period`` and simuformer's integer-time
redraws do (:func:`redrawn_weights`), and a trained checkpoint's heads
(``jaxdyn.encoder.attention_heads`` → :meth:`DepthAttention.from_heads`).
"""

from __future__ import annotations

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..kernels._attention import KERNELS, HIGHEST
from ..kernels._variants import heads_interaction
from ..sphere import tangent_project
from ._fields import AbstractParticleModel


class DepthAttention(AbstractParticleModel):
    r"""Multi-head attention on the sphere with one weight set per layer (module docstring).

    Args:
      Q, K: (L, H, k, d) arrays (or (L, d, d) for one head a layer).
      V: (L, H, d, d) (or (L, d, d)).
      beta: inverse temperature β > 0 (scalar array leaf).
      period: τ > 0, the time each layer acts (scalar array leaf).
      u: (L, H, d) key-side logit biases or None (0); c: (L, d) drifts or None (0).
      kernel, k_block, q_block: the kernel of :class:`~jaxdyn.MultiHeadAttention`
        (``jaxdyn.kernels.heads_interaction``, the key-side bias β⟨u, x_j⟩ its ``key_bias``):
        ``"dense"`` | ``"blocked"`` (one pass over the key blocks for all heads) |
        ``"auto"``; block sizes as :class:`~jaxdyn.SphereAttention`.
    """

    manifold: ClassVar[str] = "sphere"
    Q: jax.Array
    K: jax.Array
    V: jax.Array
    u: jax.Array
    c: jax.Array
    beta: jax.Array
    period: jax.Array
    kernel: str = eqx.field(static=True, default="auto")
    k_block: Optional[int] = eqx.field(static=True, default=None)
    q_block: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, beta, period=1.0, *, u=None, c=None, kernel="auto", k_block=None,
                 q_block=None):
        arrs = [a for a in (Q, K, V) if hasattr(a, "dtype")]
        dt = jnp.result_type(*[a.dtype for a in arrs]) if arrs else jnp.float32
        Q, K, V = (jnp.asarray(a, dt) for a in (Q, K, V))
        if Q.ndim == 3:
            Q, K, V = Q[:, None], (K[:, None] if K.ndim == 3 else K), (V[:, None] if V.ndim == 3 else V)
        if Q.ndim != 4:
            raise ValueError(f"Q must have shape (L, H, k, d) (or (L, d, d) for one head a "
                             f"layer), got {Q.shape}")
        L, H, k, d = Q.shape
        if K.shape != (L, H, k, d):
            raise ValueError(f"K must have the shape of Q, {(L, H, k, d)}, got {K.shape}")
        if V.shape != (L, H, d, d):
            raise ValueError(f"V must have shape {(L, H, d, d)} (L layers, H heads, d×d), "
                             f"got {V.shape}")
        u = jnp.zeros((L, H, d), dt) if u is None else jnp.asarray(u, dt)
        c = jnp.zeros((L, d), dt) if c is None else jnp.asarray(c, dt)
        if u.shape != (L, H, d):
            raise ValueError(f"u (key-side logit bias) must have shape {(L, H, d)}, got {u.shape}")
        if c.shape != (L, d):
            raise ValueError(f"c (constant drift) must have shape {(L, d)}, got {c.shape}")
        self.Q, self.K, self.V, self.u, self.c = Q, K, V, u, c
        self.beta = jnp.asarray(beta, dt)
        self.period = jnp.asarray(period, dt)
        for name in ("beta", "period"):
            v = getattr(self, name)
            if v.ndim != 0:
                raise ValueError(f"{name} must be a scalar, got shape {v.shape}")
            if not isinstance(v, jax.core.Tracer) and not bool(v > 0):
                raise ValueError(f"{name} must be > 0, got {float(v)}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.kernel = kernel
        self.k_block = None if k_block is None else int(k_block)
        self.q_block = None if q_block is None else int(q_block)

    @classmethod
    def from_heads(cls, heads, *, beta=None, period=1.0, biases=True, **kernel):
        """From ``jaxdyn.encoder.attention_heads(params, cfg)`` (a dict of Q, K, V, u, c and
        the encoder's own scale ``beta`` = 1/√d_h, used when ``beta`` is None). ``biases=False``
        drops u and c (the pure bilinear heads); ``kernel``: ``kernel``, ``k_block``, ``q_block``."""
        return cls(heads["Q"], heads["K"], heads["V"], heads["beta"] if beta is None else beta,
                   period, u=heads["u"] if biases else None, c=heads["c"] if biases else None,
                   **kernel)

    @property
    def dim(self) -> int:
        return self.Q.shape[-1]

    @property
    def n_layers(self) -> int:
        return self.Q.shape[0]

    @property
    def n_heads(self) -> int:
        return self.Q.shape[1]

    def layer(self, t):
        """l(t) = min(⌊t/τ⌋, L − 1) (t = lτ up to round-off counts as layer l)."""
        eps = jnp.finfo(self.Q.dtype).eps
        s = jnp.asarray(t, self.Q.dtype) / self.period
        return jnp.clip(jnp.floor(s + 64 * eps * jnp.maximum(1.0, s)), 0,
                        self.n_layers - 1).astype(jnp.int32)

    def layer_model(self, l: int) -> "DepthAttention":
        """Layer l alone (L = 1): run a layer's segment [lτ, (l+1)τ] with it for exact
        layer-by-layer runs with schemes that evaluate at a step's end (RK4's last stage at
        t = (l+1)τ sees layer l + 1 in the full model; Euler and exp-Euler never do)."""
        return DepthAttention(self.Q[l:l + 1], self.K[l:l + 1], self.V[l:l + 1], self.beta,
                              self.period, u=self.u[l:l + 1], c=self.c[l:l + 1],
                              kernel=self.kernel, k_block=self.k_block, q_block=self.q_block)

    def layer_ambient(self, l, x):
        """Σ_h V_{l,h} Σ_j w^{l,h}_ij x_j + c_l for layer l (x: (N, d), any radius): the heads
        of :class:`~jaxdyn.MultiHeadAttention`'s kernel (dense or blocked), with the key bias
        β⟨u_{l,h}, x_j⟩."""
        q = jnp.einsum("hpd,nd->hnp", self.Q[l], x, precision=HIGHEST)
        k = jnp.einsum("hpd,nd->hnp", self.K[l], x, precision=HIGHEST)
        bias = self.beta * jnp.einsum("hd,nd->hn", self.u[l], x, precision=HIGHEST)
        m = heads_interaction(q, k, x, self.beta, key_bias=bias, kernel=self.kernel,
                              k_block=self.k_block, q_block=self.q_block)
        return jnp.einsum("hne,hde->nd", m, self.V[l], precision=HIGHEST) + self.c[l]

    def ambient(self, t, x, args=None):
        """The field before the tangent projection (``__call__ = P⊥(x) ambient``)."""
        return self.layer_ambient(self.layer(t), x)

    def __call__(self, t, x, args=None):
        return tangent_project(x, self.ambient(t, x, args))


def redrawn_weights(spec: dict, d: int, n_periods: int, n_heads: int = 1, dtype=None):
    """(Q, K, V) of shape (n_periods, n_heads, d, d): a fresh draw of the ensemble ``spec``
    (a ``weights`` section: ``{"ensemble": "gaussian", "scale": 1.0, "seed": 0}``, see
    :mod:`jaxdyn.weights`) for every period and head, seeded by (seed, period, head), so
    the draws are reproducible and independent (``dtype`` None: JAX's default float). With ``DepthAttention(Q, K, V, β, period)``
    this is rotf's ``--regen_period`` (simuformer's integer-time redraws: period 1)."""
    from ..weights import build_weights

    if int(n_periods) < 1 or int(n_heads) < 1:
        raise ValueError(f"n_periods and n_heads must be >= 1, got {n_periods}, {n_heads}")
    seed = spec.get("seed", 0)
    out = np.empty((3, n_periods, n_heads, d, d))
    for p in range(n_periods):
        for h in range(n_heads):
            out[:, p, h] = build_weights({**spec, "seed": [int(seed), p, h]}, d)
    return tuple(jnp.asarray(a) if dtype is None else jnp.asarray(a, dtype) for a in out)
