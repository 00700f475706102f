"""Attention interaction kernels: the hot loop of every particle model.

Every kernel computes, for queries ``x`` (n, d) and keys/values ``y`` (m, d),

    m_i = Σ_j w_ij y_j ,    logits  l_ij = β x_iᵀ B y_j

with one of three normalisations of the weights:

* ``"softmax"``       w_ij = exp(l_ij) / Σ_k exp(l_ik)              (SA, Paper A)
* ``"unnormalized"``  w_ij = exp(l_ij) / m                          (USA, GLPR)
* ``"hardmax"``       w_ij = 1/|J_i| on J_i = argmax_j x_iᵀ B y_j   (β = ∞ on the
                      empirical measure; ties share the weight)

The value matrix is applied by the caller (``V m_i``), since ``V Σ_j w_ij y_j`` costs d²
per query instead of d² per pair.

Two implementations with identical results:

* ``dense``: materialises the (n, m) logits; fastest for small m.
* ``blocked``: online (streaming) softmax over key blocks (Rabe & Staats 2021, the
  flash-attention recurrence), with query blocks as well; memory O(q_block · k_block),
  never O(n · m).

Softmax weights are computed max-subtracted, so β x ᵀBy of order 10⁴ does not overflow
float32. Matmuls run at ``Precision.HIGHEST`` (on GPUs float32 matmuls otherwise default
to TF32, which ruins logits at large β).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST

KERNELS = ("dense", "blocked", "auto")
NORMALIZATIONS = ("softmax", "unnormalized", "hardmax")

# ``kernel="auto"`` switches to the blocked kernel above this many keys: blocking keeps
# the working set in cache, and dense would materialise n·m floats.
AUTO_BLOCKED_MIN_KEYS = 2048


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def resolve_kernel(kernel: str, m: int) -> str:
    """The concrete kernel ``"auto"`` stands for at ``m`` keys."""
    _check_choice("kernel", kernel, KERNELS)
    if kernel == "auto":
        return "blocked" if m > AUTO_BLOCKED_MIN_KEYS else "dense"
    return kernel


def interaction(
    x,
    y,
    B,
    beta,
    *,
    normalization: str = "softmax",
    kernel: str = "auto",
    k_block: int = 512,
    q_block: int = 4096,
):
    """Attention average ``m_i = Σ_j w_ij y_j`` with logits ``β x_iᵀ B y_j``.

    Args:
      x: queries, shape (n, d).
      y: keys (also the values averaged), shape (m, d).
      B: bilinear form, shape (d, d) (``B = Qᵀ K`` for Paper A).
      beta: inverse temperature, scalar (ignored by ``"hardmax"``).
      normalization: ``"softmax"`` | ``"unnormalized"`` | ``"hardmax"``.
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"``.
      k_block, q_block: block sizes of the blocked kernel (keys, queries).

    Returns:
      (n, d) array ``m``.
    """
    _check_choice("normalization", normalization, NORMALIZATIONS)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(
            f"interaction expects x (n, d) and y (m, d) with the same d; got {x.shape} and {y.shape}"
        )
    d = x.shape[1]
    if B.shape != (d, d):
        raise ValueError(f"B must have shape ({d}, {d}); got {B.shape}")
    kernel = resolve_kernel(kernel, y.shape[0])
    beta = jnp.asarray(beta, dtype=x.dtype)
    if normalization == "hardmax":
        # β plays no role; the arg-max of x_iᵀ B y_j is scale-invariant.
        beta = jnp.ones((), x.dtype)
    qx = beta * jnp.matmul(x, B, precision=HIGHEST)  # (n, d): β Bᵀ x_i as rows
    if kernel == "dense":
        return _dense(qx, y, normalization)
    return _blocked(qx, y, normalization, int(k_block), int(q_block))


def _dense(qx, y, normalization):
    logits = jnp.matmul(qx, y.T, precision=HIGHEST)  # (n, m)
    if normalization == "softmax":
        w = jax.nn.softmax(logits, axis=-1)
    elif normalization == "unnormalized":
        w = jnp.exp(logits) / y.shape[0]
    else:
        mx = jnp.max(logits, axis=-1, keepdims=True)
        hit = (logits == mx).astype(y.dtype)
        w = hit / jnp.sum(hit, axis=-1, keepdims=True)
    return jnp.matmul(w, y, precision=HIGHEST)


def _pad_rows(a, multiple):
    n = a.shape[0]
    nb = max(1, math.ceil(n / multiple))
    pad = nb * multiple - n
    if pad:
        a = jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)], axis=0)
    return a, nb


def _blocked(qx, y, normalization, k_block, q_block):
    n, d = qx.shape
    m = y.shape[0]
    kb = max(1, min(k_block, m))
    yp, nkb = _pad_rows(y, kb)
    valid = (jnp.arange(nkb * kb) < m).reshape(nkb, kb)
    yb = yp.reshape(nkb, kb, d)
    neg_inf = jnp.array(-jnp.inf, qx.dtype)

    def one_query_block(q):  # q: (qb, d)
        qb = q.shape[0]

        def step(carry, inp):
            mx, s, acc = carry
            yk, vk = inp
            l = jnp.matmul(q, yk.T, precision=HIGHEST)  # (qb, kb)
            l = jnp.where(vk[None, :], l, neg_inf)
            if normalization == "unnormalized":
                # Global reference 0: plain exp, summed (no normalisation).
                p = jnp.where(vk[None, :], jnp.exp(l), 0.0)
                return (mx, s, acc + jnp.matmul(p, yk, precision=HIGHEST)), None
            bm = jnp.max(l, axis=-1)
            if normalization == "hardmax":
                new = jnp.maximum(mx, bm)
                keep = (mx == new).astype(q.dtype)
                hit = (l == new[:, None]).astype(q.dtype)
                s = s * keep + jnp.sum(hit, axis=-1)
                acc = acc * keep[:, None] + jnp.matmul(hit, yk, precision=HIGHEST)
                return (new, s, acc), None
            new = jnp.maximum(mx, bm)
            scale = jnp.exp(mx - new)  # exp(-inf) = 0 on the first block
            p = jnp.exp(l - new[:, None])
            s = s * scale + jnp.sum(p, axis=-1)
            acc = acc * scale[:, None] + jnp.matmul(p, yk, precision=HIGHEST)
            return (new, s, acc), None

        init = (
            jnp.full((qb,), -jnp.inf, q.dtype),
            jnp.zeros((qb,), q.dtype),
            jnp.zeros((qb, d), q.dtype),
        )
        (mx, s, acc), _ = jax.lax.scan(step, init, (yb, valid))
        if normalization == "unnormalized":
            return acc / m
        return acc / s[:, None]

    if n <= q_block:
        return one_query_block(qx)
    qp, nqb = _pad_rows(qx, q_block)
    out = jax.lax.map(one_query_block, qp.reshape(nqb, q_block, d))
    return out.reshape(nqb * q_block, d)[:n]
