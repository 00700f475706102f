"""Weights that vary with depth (docs/math.md §H.2).

One multi-head attention set per layer, piecewise constant in time:

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

from typing import ClassVar, Mapping, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..kernels._attention import HIGHEST
from ..kernels._variants import _heads_interaction as heads_interaction
from .._checks import check_bounds, check_integer
from ._fields import AbstractAttentionModel, check_shape, kernel_options
from ._heads import host_or_traced
from ._params import Domain, float_dtype, parameter, to_array


class DepthAttention(AbstractAttentionModel):
    r"""Multi-head attention on the sphere with one weight set per layer (module docstring).

    Args:
      Q: (L, H, k, d) query weights (or (L, d, d) for one head a layer).
      K: (L, H, k, d) key weights (or (L, d, d)).
      V: (L, H, d, d) value maps (or (L, d, d)).
      beta: inverse temperature β > 0, finite (scalar array leaf).
      period: τ > 0, finite: the time each layer acts (scalar array leaf).
      u: (L, H, d) key-side logit biases or None (0).
      c: (L, d) drifts or None (0).
      kernel: the kernel of :class:`~jaxdyn.MultiHeadAttention`
        (``jaxdyn.kernels.heads_interaction``, the key-side bias β⟨u, x_j⟩ its ``key_bias``):
        ``"dense"`` | ``"blocked"`` (one pass over the key blocks for all heads) | ``"auto"``.
      k_block: blocked-kernel key block size (None: the platform's default).
      q_block: blocked-kernel query block size (None: the platform's default).

    Raises:
      ValueError: for shapes that do not fit (L, H, k, d), no layer or head, a concrete β or τ
        that is not finite and > 0, an unknown kernel.
    """

    domains: ClassVar[Mapping[str, Domain]] = {
        "beta": Domain("positive", 0, "inverse temperature"),
        "period": Domain("positive", 0, "time each layer acts")}
    u: jax.Array
    c: jax.Array
    beta: jax.Array
    period: jax.Array
    kernel: str = eqx.field(static=True, default="auto")
    k_block: Optional[int] = eqx.field(static=True, default=None)
    q_block: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, beta, period=1.0, *, u=None, c=None, kernel="auto", k_block=None,
                 q_block=None):
        dt = float_dtype(Q, K, V)
        Q, K, V = (host_or_traced(a) for a in (Q, K, V))
        if Q.ndim == 3:
            Q, K, V = Q[:, None], (K[:, None] if K.ndim == 3 else K), (V[:, None] if V.ndim == 3 else V)
        if Q.ndim != 4:
            raise ValueError(f"Q must have shape (L, H, k, d) (or (L, d, d) for one head a "
                             f"layer), got {Q.shape}")
        L, H, k, d = Q.shape
        if min(L, H, k, d) < 1:
            raise ValueError(f"Q must have at least one layer, head, row and column, got shape "
                             f"{Q.shape}")
        check_shape("K", K, (L, H, k, d), " (the shape of Q)")
        check_shape("V", V, (L, H, d, d), " (L layers, H heads, d×d)")
        u = np.zeros((L, H, d), dt) if u is None else u
        c = np.zeros((L, d), dt) if c is None else c
        check_shape("u (key-side logit bias)", u, (L, H, d))
        check_shape("c (constant drift)", c, (L, d))
        self.Q, self.K, self.V, self.u, self.c = (to_array(a, dt) for a in (Q, K, V, u, c))
        self.beta = parameter(DepthAttention, "beta", beta, dt)
        self.period = parameter(DepthAttention, "period", period, dt)
        if kernel == "local":
            raise ValueError("DepthAttention has no kernel='local': its heads carry key-side "
                             "logit biases u, outside the local kernel's certificate")
        self.kernel, self.k_block, self.q_block = kernel_options(kernel, k_block, q_block)[:3]

    @classmethod
    def from_heads(cls, heads, *, beta=None, period=1.0, biases=True, **kernel):
        """The field of a checkpoint's attention heads.

        Args:
          heads: ``jaxdyn.encoder.attention_heads(params, cfg)``: a dict of Q, K, V, u, c and the
            encoder's own scale ``beta`` = 1/√d_h.
          beta: the inverse temperature (None: the heads' own ``beta``).
          period: τ, the time each layer acts.
          biases: keep u and c (False: the pure bilinear heads).
          **kernel: ``kernel``, ``k_block``, ``q_block``.

        Returns:
          The :class:`DepthAttention` of the heads.
        """
        return cls(heads["Q"], heads["K"], heads["V"], heads["beta"] if beta is None else beta,
                   period, u=heads["u"] if biases else None, c=heads["c"] if biases else None,
                   **kernel)

    @property
    def n_layers(self) -> int:
        """The number of layers L."""
        return self.Q.shape[-4]

    @property
    def n_heads(self) -> int:
        """The number of heads H a layer."""
        return self.Q.shape[-3]

    def layer(self, t):
        """The layer acting at time t, l(t) = min(⌊t/τ⌋, L − 1) (t = lτ up to round-off: layer l).

        Args:
          t: time (scalar).

        Returns:
          The layer index, an int32 scalar array.
        """
        eps = jnp.finfo(self.Q.dtype).eps
        s = jnp.asarray(t, self.Q.dtype) / self.period
        return jnp.clip(jnp.floor(s + 64 * eps * jnp.maximum(1.0, s)), 0,
                        self.n_layers - 1).astype(jnp.int32)

    def layer_model(self, l: int) -> "DepthAttention":
        """Layer l alone (L = 1).

        Run a layer's segment [lτ, (l+1)τ] with it for exact layer-by-layer runs with schemes
        that evaluate at a step's end (RK4's last stage at t = (l+1)τ sees layer l + 1 in the
        full model; Euler and exp-Euler never do).

        Args:
          l: the layer index.

        Returns:
          A :class:`DepthAttention` with one layer.
        """
        return DepthAttention(self.Q[l:l + 1], self.K[l:l + 1], self.V[l:l + 1], self.beta,
                              self.period, u=self.u[l:l + 1], c=self.c[l:l + 1],
                              kernel=self.kernel, k_block=self.k_block, q_block=self.q_block)

    def layer_ambient(self, l, x):
        """Layer l's ambient field, Σ_h V_{l,h} Σ_j w^{l,h}_ij x_j + c_l.

        The heads of :class:`~jaxdyn.MultiHeadAttention`'s kernel (dense or blocked), with the
        key bias β⟨u_{l,h}, x_j⟩.

        Args:
          l: the layer index (may be traced).
          x: (N, d) points, any radius.

        Returns:
          (N, d) array.
        """
        q = jnp.einsum("hpd,nd->hnp", self.Q[l], x, precision=HIGHEST)
        k = jnp.einsum("hpd,nd->hnp", self.K[l], x, precision=HIGHEST)
        bias = self.beta * jnp.einsum("hd,nd->hn", self.u[l], x, precision=HIGHEST)
        m = heads_interaction(q, k, x, self.beta, key_bias=bias, kernel=self.kernel,
                              k_block=self.k_block, q_block=self.q_block)
        return jnp.einsum("hne,hde->nd", m, self.V[l], precision=HIGHEST) + self.c[l]

    def ambient(self, t, x, args=None):
        """The ambient field of the layer l(t) acting at time t (before the tangent projection)."""
        return self.layer_ambient(self.layer(t), x)


def redrawn_weights(spec: dict, d: int, n_periods: int, n_heads: int = 1, dtype=None):
    """Weights redrawn every period: a fresh draw of an ensemble for every period and head.

    Seeded by (seed, period, head), so the draws are reproducible and independent. With
    ``DepthAttention(Q, K, V, β, period)`` this is rotf's ``--regen_period`` (simuformer's
    integer-time redraws: period 1).

    Args:
      spec: a ``weights`` section (``{"ensemble": "gaussian", "scale": 1.0, "seed": 0}``, see
        :mod:`jaxdyn.weights`).
      d: the dimension.
      n_periods: the number of periods (layers), >= 1.
      n_heads: heads a period, >= 1.
      dtype: the dtype of the arrays (None: JAX's default float).

    Returns:
      ``(Q, K, V)``, each of shape (n_periods, n_heads, d, d).

    Raises:
      ValueError: for a d, number of periods or heads that is not an integer >= 1, a spec that
        is not a dict, a ``scale`` that is not a finite number > 0, or a weights section that
        cannot be built
        (``jaxdyn.weights.WeightsError``).
    """
    from ..weights import build_weights

    if not isinstance(spec, dict):
        raise ValueError(f"spec must be a weights section (a dict), got {type(spec).__name__}")
    try:
        d = check_integer("d (the dimension)", d, minimum=1)
        n_periods = check_integer("n_periods", n_periods, minimum=1)
        n_heads = check_integer("n_heads", n_heads, minimum=1)
        if "scale" in spec:
            check_bounds("spec['scale']", spec["scale"], low=0, low_open=True,
                         what=" (the ensemble's scale)")
    except ValueError as e:
        raise ValueError(f"redrawn_weights: {e}") from None
    seed = spec.get("seed", 0)
    out = np.empty((3, n_periods, n_heads, d, d))
    for p in range(n_periods):
        for h in range(n_heads):
            out[:, p, h] = build_weights({**spec, "seed": [int(seed), p, h]}, d)
    dt = float_dtype(default=jnp.result_type(float) if dtype is None else dtype)
    return tuple(to_array(a, dt) for a in out)
