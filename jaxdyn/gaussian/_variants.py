"""Closed covariance right-hand sides of the attention variants (docs/math.md §G.5).

The covariance ODEs of vcastin/2025-transformers-PDEs.

A centred Gaussian cloud N(0, S) in R^d under ``ẋ = Σ_h V_h E_{w^h}[y | x]`` (the particle
field of :class:`jaxdyn.MultiHeadAttention` without the sphere projection; the values are
the particles) moves by a linear field ``ẋ = M(S) x``, so it stays a centred Gaussian with

    Ṡ = M(S) S + S M(S)ᵀ,   M(S) = Σ_h V_h T_h(S),

where ``E_{w^h}[y | x] = T_h(S) x`` with A_h = β K_hᵀ Q_h:

* softmax:  T = S A                                  (exp(xᵀA ᵀy) tilts N(0, S))
* L2:       T = 2 S (I + 2β K_hᵀK_h S)^{-1} A          (logits −β|Q_h x − K_h y|²)
* Sinkhorn: T = S^{1/2} Z S^{1/2} A,  Z = 2 (I + (I + 4 N)^{1/2})^{-1},
            N = S^{1/2} A S Aᵀ S^{1/2}               (entropic plan, ε = 1/β)

On a cloud N(m, S) with a mean the conditional mean is affine, ``E_{w^h}[y | x] = c_h + T_h x``
with the same T_h and c_h = m (softmax), (I + 2β S K_hᵀK_h)^{-1} m (L2), (I − T_h) m
(Sinkhorn: the plan is translation-equivariant); :func:`variant_moment_rhs` is the moment
ODE of ``ẋ = A x + b + Σ_h V_h E_{w^h}[y | x]`` that :func:`jaxdyn.solve_moments` integrates
with ``attention=...`` (docs/math.md §G.5).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._checks import nan_where, scalar_domain
from ..kernels._attention import HIGHEST

COVARIANCE_ATTENTIONS = ("softmax", "l2", "sinkhorn")


def _mm(a, b):
    """``a @ b`` at the highest precision."""
    return jnp.matmul(a, b, precision=HIGHEST)


def _sym_sqrt(S):
    """The symmetric square root of a PSD matrix (eigenvalues clipped at 0)."""
    w, U = jnp.linalg.eigh(S)
    return _mm(U * jnp.sqrt(jnp.clip(w, 0.0)), U.T)


def _heads(Q, K, V):
    """``(Q, K, V)`` as arrays with the head axis, shapes checked."""
    Q, K, V = (jnp.asarray(a) for a in (Q, K, V))
    Q, K, V = (a[None] if a.ndim == 2 else a for a in (Q, K, V))
    if Q.ndim != 3 or K.shape != Q.shape or V.shape != (Q.shape[0], Q.shape[2], Q.shape[2]):
        raise ValueError(f"expected Q, K (H, p, d) and V (H, d, d) (or one head without the H "
                         f"axis); got {Q.shape}, {K.shape}, {V.shape}")
    return Q, K, V


def _beta_checked(beta):
    """β checked (finite, >= 0): a concrete β outside refused, a traced one made NaN.

    Returns:
        ``(message, beta)``: the ValueError's message for a concrete β out of its domain
        (else None) and β, NaN where a traced β is out of its domain (the results follow).
    """
    err, bad = scalar_domain("beta", beta, low=0, what=" (inverse temperature)")
    return err, nan_where(bad, beta)


def conditional_mean_map(S, Q, K, beta=1.0, *, attention="softmax"):
    """``T`` (d, d) with ``E_w[y | x] = T x`` for one head on N(0, S) (module doc).

    Args:
        S: (d, d) covariance.
        Q: (p, d) query weights.
        K: (p, d) key weights.
        beta: inverse temperature, finite and >= 0. A traced value outside the domain gives
            NaN.
        attention: ``"softmax"`` | ``"l2"`` | ``"sinkhorn"``.

    Returns:
        (d, d) T.

    Raises:
        ValueError: an unknown attention, or a concrete β that is negative or not finite.
    """
    if attention not in COVARIANCE_ATTENTIONS:
        raise ValueError(f"attention must be one of {COVARIANCE_ATTENTIONS}, got {attention!r}")
    err, beta = _beta_checked(beta)
    if err:
        raise ValueError(err)
    d = S.shape[0]
    A = beta * _mm(K.T, Q)
    if attention == "softmax":
        return _mm(S, A)
    if attention == "l2":
        eye = jnp.eye(d, dtype=S.dtype)
        return 2.0 * _mm(S, jnp.linalg.solve(eye + 2.0 * beta * _mm(_mm(K.T, K), S), A))
    R = _sym_sqrt(S)
    N = _mm(_mm(R, _mm(_mm(A, S), A.T)), R)
    N = 0.5 * (N + N.T)
    eye = jnp.eye(d, dtype=S.dtype)
    Z = 2.0 * jnp.linalg.inv(eye + _sym_sqrt(eye + 4.0 * N))
    return _mm(_mm(_mm(R, Z), R), A)


def covariance_rhs(S, Q, K, V, beta=1.0, *, attention="softmax"):
    """The closed covariance right side ``Ṡ = M S + S Mᵀ``, ``M = Σ_h V_h T_h(S)`` (module doc).

    For a centred Gaussian N(0, S) under multi-head softmax, L2 or Sinkhorn attention in R^d.

    Args:
        S: (d, d) covariance (symmetric positive definite).
        Q: (H, p, d) per-head query weights (or (p, d)).
        K: (H, p, d) per-head key weights (or (p, d)).
        V: (H, d, d) per-head value weights (or (d, d)).
        beta: inverse temperature (logits β⟨Q_h x, K_h y⟩, or −β|Q_h x − K_h y|²), finite and
            >= 0 (a ValueError from :func:`conditional_mean_map` otherwise). A traced value
            outside the domain gives NaN.
        attention: ``"softmax"`` | ``"l2"`` | ``"sinkhorn"`` (entropic ε = 1/β).

    Returns:
        (d, d) symmetric.
    """
    Q, K, V = _heads(Q, K, V)
    S = jnp.asarray(S)
    M = sum(_mm(V[h], conditional_mean_map(S, Q[h], K[h], beta, attention=attention))
            for h in range(Q.shape[0]))
    MS = _mm(M, S)
    return MS + MS.T


def conditional_mean_affine(m, S, Q, K, beta=1.0, *, attention="softmax"):
    """``(c, T)`` with ``E_w[y | x] = c + T x`` for one head on N(m, S) (module doc).

    Args:
        m: (d,) mean.
        S: (d, d) covariance.
        Q: the head's query weights, as for :func:`conditional_mean_map`.
        K: its key weights, as there.
        beta: the inverse temperature, as there (a traced value outside the domain gives NaN).
        attention: the attention, as there (a ValueError from there for an unknown one).

    Returns:
        ``(c (d,), T (d, d))``.
    """
    T = conditional_mean_map(S, Q, K, beta, attention=attention)
    bad = scalar_domain("beta", beta, low=0)[1]  # (c = m for softmax: NaN with T)
    if attention == "softmax":
        c = m
    elif attention == "l2":
        eye = jnp.eye(S.shape[0], dtype=S.dtype)
        c = jnp.linalg.solve(eye + 2.0 * beta * _mm(S, _mm(K.T, K)), m)
    else:
        c = m - _mm(T, m)
    return nan_where(bad, c), T


def variant_moment_rhs(m, S, A, b, Q, K, V, beta=1.0, *, attention="softmax"):
    """``(m', S')`` of a Gaussian N(m, S) under ``ẋ = A x + b + Σ_h V_h E_{w^h}[y | x]``.

        m' = A m + b + Σ_h V_h (c_h + T_h m),   S' = M S + S Mᵀ,   M = A + Σ_h V_h T_h(S),

    heads vmapped; ``S'`` is formed as ``G + Gᵀ`` (exactly symmetric). With one softmax head
    and ``β KᵀQ = B`` this is Paper B's moment ODE.

    Args:
        m: (d,) mean.
        S: (d, d) covariance.
        A: (d, d) drift matrix.
        b: (d,) drift offset.
        Q: (H, p, d) (or (p, d)).
        K: (H, p, d) (or (p, d)).
        V: (H, d, d) (or (d, d)).
        beta: inverse temperature, finite and >= 0 (a ValueError from
            :func:`conditional_mean_map` otherwise). A traced value outside the domain gives
            NaN.
        attention: ``"softmax"`` | ``"l2"`` | ``"sinkhorn"``.

    Returns:
        ``(m', S')``.
    """
    Q, K, V = _heads(Q, K, V)
    c, T = jax.vmap(lambda q, k: conditional_mean_affine(m, S, q, k, beta,
                                                         attention=attention))(Q, K)
    M = A + jnp.sum(jnp.matmul(V, T, precision=HIGHEST), axis=0)
    dm = _mm(A, m) + b + jnp.sum(jnp.einsum("hde,he->hd", V, c + _mm(T, m[:, None])[..., 0],
                                            precision=HIGHEST), axis=0)
    G = _mm(M, S)
    return dm, G + G.T
