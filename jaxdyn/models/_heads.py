"""Multi-head attention on the sphere: :class:`MultiHeadAttention`.

Causal masks, ALiBi / RoPE positions and L2 or Sinkhorn weights.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Mapping, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..choices import ATTENTIONS, MASKS
from ..kernels._attention import AUTO_LOCAL_MAX_VISITED, HIGHEST, resolve_kernel
from ..kernels._local import DEFAULT_TOL, local_attention
from ..kernels._online import query_positions
from ..kernels._variants import _heads_interaction as heads_interaction, rope
from ..kernels._variants import _sinkhorn_key_bias as sinkhorn_key_bias
from ._fields import AbstractAttentionModel, kernel_options
from ._params import Domain, check_domain, float_dtype, is_traced, parameter, to_array


def host_or_traced(a):
    """``a`` itself if traced, else as a NumPy array (reshaped on the host, not by a program)."""
    return a if is_traced(a) else np.asarray(a)


def rope_frequencies(p: int, base) -> np.ndarray:
    """RoPE's frequencies ω_c = base^(−2c/p), c = 0 … p//2 − 1 (Su et al. 2021), in float64.

    Args:
      p: the head dimension.
      base: the RoPE base, finite and > 0.

    Returns:
      A float64 NumPy array of p // 2 frequencies.

    Raises a ValueError (through :func:`check_domain`) for a base that is not finite and > 0.
    """
    check_domain("rope_base", base, Domain("positive", 0, "RoPE base"))
    return float(base) ** (-2.0 * np.arange(p // 2) / p)


def _check_choice(name: str, value, choices: tuple) -> str:
    """Return ``value`` if it is one of ``choices``; else raise a ValueError naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


class MultiHeadAttention(AbstractAttentionModel):
    r"""Multi-head self-attention dynamics on S^{d−1} (docs/math.md §G).

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
      Q: (H, p, d) query weights (or (p, d): one head).
      K: (H, p, d) key weights (or (p, d)).
      V: (H, d, d) value maps (or (d, d)).
      beta: inverse temperature β > 0, finite (array leaf; a traced β <= 0 is reported by
        :meth:`invalid`).
      mask: ``"none"`` | ``"causal"``.
      alibi: ALiBi slopes α_h ≥ 0, (H,) or a scalar for every head; None: no bias.
      rope: RoPE frequencies, (p // 2,), or ``True`` for ``rope_base^(−2c/p)``; None: no
        rotation.
      rope_base: the base of ``rope=True``'s frequencies (finite, > 0).
      attention: ``"softmax"`` | ``"l2"`` | ``"sinkhorn"``.
      sinkhorn_iters: Sinkhorn sweeps (an integer ≥ 1) of ``attention="sinkhorn"``.
      kernel: ``"dense"`` | ``"blocked"`` | ``"local"`` | ``"auto"``, as
        :class:`~jaxdyn.SphereAttention` (``"local"``: softmax heads without mask or
        positions; each head's keys ``K_h x_j`` are ordered by the particles x).
      k_block: blocked-kernel key block size (None: the platform's default).
      q_block: blocked-kernel query block size (None: the platform's default).
      tol: the local kernel's certified error bound of each head's average relative to
        ``max_j |x_j|``.
      capacity: the local kernel's list capacity (None: its default).

    Raises:
      ValueError: for shapes that do not fit (H, p, d), an empty head, concrete RoPE frequencies
        that are not finite, a concrete β or slope out of its domain, an unknown mask,
        attention or kernel, a causal Sinkhorn, a bad ``sinkhorn_iters``, ``rope`` or
        ``rope_base``, ``kernel="local"`` with a mask, positions or non-softmax weights, a bad
        ``tol``/``capacity`` (non-finite weights make the state non-finite: the drivers
        report it).
    """

    domains: ClassVar[Mapping[str, Domain]] = {
        "beta": Domain("positive", 0, "inverse temperature"),
        "alibi": Domain("nonnegative", 1, "alibi slopes")}
    beta: jax.Array
    alibi: Optional[jax.Array]
    rope: Optional[jax.Array]
    mask: str = eqx.field(static=True, default="none")
    attention: str = eqx.field(static=True, default="softmax")
    sinkhorn_iters: int = eqx.field(static=True, default=0)
    kernel: str = eqx.field(static=True, default="auto")
    k_block: Optional[int] = eqx.field(static=True, default=None)
    q_block: Optional[int] = eqx.field(static=True, default=None)
    tol: float = eqx.field(static=True, default=DEFAULT_TOL)
    capacity: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, beta, *, mask="none", alibi=None, rope=None, rope_base=10000.0,
                 attention="softmax", sinkhorn_iters=5, kernel="auto", k_block=None,
                 q_block=None, tol=DEFAULT_TOL, capacity=None):
        dt = float_dtype(Q, K, V)
        Q, K, V = (host_or_traced(a) for a in (Q, K, V))
        Q, K, V = (a[None] if a.ndim == 2 else a for a in (Q, K, V))
        if Q.ndim != 3 or K.shape != Q.shape:
            raise ValueError(f"Q and K must have the same shape (H, p, d) (or (p, d)); got "
                             f"{Q.shape} and {K.shape}")
        H, p, d = Q.shape
        if min(H, p, d) < 1:
            raise ValueError(f"Q and K must have at least one head, one row and one column, "
                             f"got shape {Q.shape}")
        if V.shape != (H, d, d):
            raise ValueError(f"V must have shape ({H}, {d}, {d}) (one (d, d) value map a head, "
                             f"the output projection absorbed), got {V.shape}")
        self.Q, self.K, self.V = (to_array(a, dt) for a in (Q, K, V))
        self.beta = parameter(MultiHeadAttention, "beta", beta, dt)
        self.mask = _check_choice("mask", mask, MASKS)
        self.attention = _check_choice("attention", attention, ATTENTIONS)
        if attention == "sinkhorn":
            if isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, (int, np.integer)) \
                    or sinkhorn_iters < 1:
                raise ValueError(f"sinkhorn_iters must be an integer >= 1, got {sinkhorn_iters!r}")
            if mask == "causal":
                raise ValueError("attention='sinkhorn' takes no causal mask (a lower-triangular "
                                 "doubly stochastic matrix is the identity)")
        self.sinkhorn_iters = int(sinkhorn_iters) if attention == "sinkhorn" else 0
        if alibi is not None:
            alibi = host_or_traced(alibi)
            if alibi.ndim == 0:
                alibi = (jnp if is_traced(alibi) else np).broadcast_to(alibi, (H,))
            if alibi.shape != (H,):
                raise ValueError(f"alibi must be a scalar or hold one slope a head, H = {H}, got "
                                 f"shape {alibi.shape}")
            alibi = parameter(MultiHeadAttention, "alibi", alibi, dt)
        check_domain("rope_base", rope_base, Domain("positive", 0, "RoPE base"))
        if rope is True:
            rope = rope_frequencies(p, rope_base)
        if rope is not None:
            if tuple(np.shape(rope)) != (p // 2,):
                raise ValueError(f"rope must hold p // 2 = {p // 2} frequencies, got shape "
                                 f"{tuple(np.shape(rope))}")
            check_domain("rope", rope, Domain("finite", 1, "RoPE frequencies"))
            rope = to_array(rope, dt)
        self.alibi, self.rope = alibi, rope
        (self.kernel, self.k_block, self.q_block, self.tol,
         self.capacity) = kernel_options(kernel, k_block, q_block, tol, capacity)
        if kernel == "local" and not self._plain:
            raise ValueError("kernel='local' serves softmax heads without mask, ALiBi or RoPE "
                             f"(got mask={mask!r}, attention={attention!r}, alibi "
                             f"{'set' if alibi is not None else 'None'}, rope "
                             f"{'set' if rope is not None else 'None'})")

    @property
    def _plain(self) -> bool:
        """Softmax heads without mask or positions: the local kernel's case."""
        return (self.mask == "none" and self.attention == "softmax" and self.alibi is None
                and self.rope is None)

    def _local_heads(self, x, max_visited=None):
        """Every head's average by the local kernel, and the heads' certificates."""
        # returns (H, N, d) averages and LocalStats with a heads axis; one program a call
        # shape (an eager call would otherwise dispatch the kernel's loops op by op)
        return _local_heads_jit(self.Q, self.K, x, jnp.asarray(self.beta), tol=self.tol,
                                capacity=self.capacity, k_block=self.k_block,
                                q_block=self.q_block, max_visited=max_visited)

    @property
    def _rows_kernel(self) -> str:
        """The kernel of :meth:`ambient_rows` (the blocked one for ``"local"``)."""
        return "blocked" if self.kernel == "local" else self.kernel

    def local_stats(self, x, t=0.0):
        """The local kernel's certificate of every head at the particles x.

        Args:
          x: (N, d) particles.
          t: time (unused: the field is autonomous).

        Returns:
          :class:`jaxdyn.kernels.LocalStats` with a leading heads axis.

        Raises:
          ValueError: heads outside the local kernel's case (a mask, positions, other weights).
        """
        if not self._plain:
            raise ValueError("local_stats: the local kernel serves softmax heads without mask "
                             "or positions")
        return self._local_heads(x)[1]

    @property
    def heads(self) -> int:
        """The number of heads H."""
        return self.Q.shape[-3]

    def head_averages(self, x):
        """Every head's attention average m_hi = Σ_j w^h_ij x_j.

        Args:
          x: (N, d) points (the row index is the position).

        Returns:
          (H, N, d) array.
        """
        kernel = resolve_kernel(self.kernel, x.shape[0]) if self._plain else "blocked"
        if kernel in ("local", "auto_local"):
            return self._local_heads(
                x, AUTO_LOCAL_MAX_VISITED if kernel == "auto_local" else None)[0]
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
        """Σ_h V_h m_hi for x of shape (N, d): the field before the tangent projection."""
        return jnp.einsum("hne,hde->nd", self.head_averages(x), self.V, precision=HIGHEST)

    def ambient_rows(self, t, rows, x, offset, args=None):
        """:meth:`ambient` at the particles ``offset, offset + 1, …`` of the cloud ``x`` only.

        Equal to ``ambient(t, x)[offset:offset + len(rows)]`` (up to rounding): the rows
        keep their positions (masks, ALiBi, RoPE, the bound shift's known logit); Sinkhorn
        weights take the column potentials of the whole cloud. Rows past the end of ``x``
        (padding) attend to every particle.

        Args:
          t: time (unused: the field is autonomous).
          rows: (n, d) the particles ``x[offset:offset + n]``.
          x: (N, d) the whole cloud (the keys and values).
          offset: the index in ``x`` of ``rows[0]``, an integer scalar (may be traced).
          args: unused.

        Returns:
          (n, d) array.
        """
        q = jnp.einsum("hpd,nd->hnp", self.Q, rows, precision=HIGHEST)
        k = jnp.einsum("hpd,nd->hnp", self.K, x, precision=HIGHEST)
        logits = "l2" if self.attention == "l2" else "dot"
        bias = None
        if self.sinkhorn_iters:  # the column potentials need every query row
            qa = jnp.einsum("hpd,nd->hnp", self.Q, x, precision=HIGHEST)
            if self.rope is not None:
                qa = rope(qa, self.rope)
            bias = sinkhorn_key_bias(
                qa, rope(k, self.rope) if self.rope is not None else k, self.beta,
                alibi=self.alibi, logits=logits, sinkhorn_iters=self.sinkhorn_iters,
                kernel=self._rows_kernel, k_block=self.k_block, q_block=self.q_block)
        if self.rope is not None:
            q = rope(q, self.rope, query_positions(rows.shape[0], offset))
            k = rope(k, self.rope)
        m = heads_interaction(
            q, k, x, self.beta, key_bias=bias, alibi=self.alibi,
            causal=self.mask == "causal", logits=logits, kernel=self._rows_kernel,
            k_block=self.k_block, q_block=self.q_block, q_offset=offset)
        return jnp.einsum("hne,hde->nd", m, self.V, precision=HIGHEST)


@functools.partial(jax.jit, static_argnames=("tol", "capacity", "k_block", "q_block",
                                             "max_visited"))
def _local_heads_jit(Qs, Ks, x, beta, *, tol, capacity, k_block, q_block, max_visited):
    """:meth:`MultiHeadAttention._local_heads`: the particles order every head's keys."""
    q = jnp.einsum("hpd,nd->hnp", Qs, x, precision=HIGHEST)
    k = jnp.einsum("hpd,nd->hnp", Ks, x, precision=HIGHEST)
    beta = beta.astype(q.dtype)

    def blocked():
        return heads_interaction(q, k, x, beta, kernel="blocked", k_block=k_block,
                                 q_block=q_block)

    def one(qh, kh, fallback):
        return local_attention(beta * qh, kh, x, kpos=x, self_keys=True, tol=tol,
                               capacity=capacity, fallback=fallback, max_visited=max_visited)

    if Qs.shape[0] == 1:
        out, stats = one(q[0], k[0], lambda: blocked()[0])
        return out[None], jax.tree.map(lambda a: a[None], stats)
    # several heads: one overflow (or auto's refusal) answers every head by the blocked kernel
    out, stats = jax.vmap(lambda qh, kh: one(qh, kh, None))(q, k)
    go = jnp.where(jnp.any(stats.overflow), 2.0,
                   jnp.max(stats.listed) / (1.0 if max_visited is None else max_visited))
    ok = jnp.all(go <= 1.0)
    out = jax.lax.cond(ok, lambda: out, blocked)
    return out, stats._replace(dense=jnp.broadcast_to(~ok, stats.dense.shape),
                               visited=jnp.where(ok, stats.visited, 1.0))
