"""Attention variants: several heads, causal masks, ALiBi biases, L2 and Sinkhorn weights.

For one head, with queries ``q`` (n, p), keys ``k`` (m, p) and values ``v`` (m, e), the
kernels compute ``m_i = Σ_j w_ij v_j`` with ``w_ij = exp(l_ij) / Σ_k exp(l_ik)`` and

    l_ij = β ⟨q_i, k_j⟩ + b_j − α |i − j|            (``logits="dot"``)
    l_ij = −β |q_i − k_j|² + b_j − α |i − j|          (``logits="l2"``)

``l_ij = −∞`` where ``j > i`` when ``causal``: particle index = position, query i attends
to keys j ≤ i. ``b_j`` is a per-key bias (``key_bias``; the Sinkhorn column potential
below), ``α ≥ 0`` the ALiBi slope (``alibi``). RoPE is not a kernel option: it rotates
``q_i`` and ``k_j`` before the call (:func:`rope`).

Heads are a leading axis of ``q``, ``k``, ``key_bias`` and ``alibi`` that the kernels
``vmap`` over, with the values shared (``v`` = the particles; each head's V_h is applied by
the caller): one dense einsum, or one blocked pass over the key blocks for every head.

L2 logits expand as ``−β|q_i|² + 2β⟨q_i, k_j⟩ − β|k_j|²``; the first term is constant in a
row and cancels in the softmax, so L2 attention is dot attention at 2β with the key bias
``−β|k_j|²``. The dense kernel forms ``|q_i − k_j|²`` by differences; the blocked kernel uses
the expansion (the test compares the two).

Sinkhorn attention (``sinkhorn_iters = s ≥ 1``) replaces the row normalisation by ``s``
Sinkhorn sweeps on ``exp(l_ij)`` in the log domain, starting from g = 0:

    f_i = −log Σ_j exp(l_ij + g_j),   g_j = −log Σ_i exp(l_ij + f_i) + log(n/m)

and returns the weights ``exp(l_ij + f_i + g_j)`` re-normalised by rows, i.e. dot/L2
attention with the extra key bias g: rows sum to 1 exactly, columns to ``n/m`` up to the
Sinkhorn error (doubly stochastic for self-attention). The entropic ε of the transport
problem is 1/β (the cost −⟨q_i, k_j⟩). No causal mask (a lower-triangular doubly stochastic
matrix is the identity).

The blocked kernel streams key blocks with a running maximum (as :mod:`._attention`),
with a −∞-safe reference (a row may see no unmasked key in a block); under a causal mask a
query block skips (``lax.cond``) every key block that lies wholly after its last query, so
a causal pass costs about half a full one (``benchmarks/bench_causal.py``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ._attention import (DEFAULT_BLOCKS, HIGHEST, _check_block, _check_choice, pad_rows,
                         resolve_kernel)

LOGITS = ("dot", "l2")
MASKS = ("none", "causal")
#: CPU query block under a causal mask: small enough that most query blocks skip key blocks
CAUSAL_Q_BLOCK = 512


def rope(z, freqs, positions=None):
    """Rotary position embedding: rotate the coordinate pairs (z_{2c}, z_{2c+1}) of row i by
    the angle ``positions_i · freqs_c`` (c < p // 2; an odd last coordinate is left alone).

    ``z`` (..., n, p); ``freqs`` (p // 2,); ``positions`` (n,) (default 0..n−1). Since
    ``R(θ_i)ᵀ R(θ_j) = R(θ_j − θ_i)``, ``⟨rope(q)_i, rope(k)_j⟩`` depends on i − j only."""
    n, p = z.shape[-2], z.shape[-1]
    half = p // 2
    if freqs.shape != (half,):
        raise ValueError(f"rope: freqs must have shape ({half},) for head dimension {p}, got "
                         f"{freqs.shape}")
    pos = jnp.arange(n, dtype=z.dtype) if positions is None else positions.astype(z.dtype)
    ang = pos[:, None] * freqs.astype(z.dtype)[None, :]  # (n, half)
    c, s = jnp.cos(ang), jnp.sin(ang)
    a, b = z[..., 0:2 * half:2], z[..., 1:2 * half:2]
    ra, rb = a * c - b * s, a * s + b * c
    out = jnp.stack([ra, rb], axis=-1).reshape(z.shape[:-1] + (2 * half,))
    return jnp.concatenate([out, z[..., 2 * half:]], axis=-1) if p % 2 else out


def default_rope_freqs(p, base=10000.0, dtype=jnp.float32):
    """RoPE's frequencies ``base^(−2c/p)``, c = 0..p//2 − 1 (Su et al. 2021)."""
    return jnp.asarray(base, dtype) ** (-2.0 * jnp.arange(p // 2, dtype=dtype) / p)


def _dense_logits(q, k, beta, key_bias, alibi, causal, logits):
    if logits == "l2":
        d2 = jnp.sum((q[:, None, :] - k[None, :, :]) ** 2, axis=-1)
        l = -beta * d2
    else:
        l = beta * jnp.matmul(q, k.T, precision=HIGHEST)
    n, m = l.shape
    if key_bias is not None:
        l = l + key_bias[None, :]
    i = jnp.arange(n)[:, None]
    j = jnp.arange(m)[None, :]
    if alibi is not None:
        l = l - alibi * jnp.abs(i - j).astype(l.dtype)
    if causal:
        l = jnp.where(j <= i, l, -jnp.inf)
    return l


def _sinkhorn_dense(l, iters):
    n, m = l.shape
    # columns to n/m (rows to 1: both total n). log(m/n), used before, asked the columns for
    # m/n: g drifted by 2 log(m/n) a sweep (cancelled by the row normalisation, but float32 lost
    # the digits of l + g)
    shift = jnp.log(jnp.asarray(n / m, l.dtype))

    def sweep(_, g):
        f = -jax.nn.logsumexp(l + g[None, :], axis=1)
        return -jax.nn.logsumexp(l + f[:, None], axis=0) + shift

    return jax.lax.fori_loop(0, iters, sweep, jnp.zeros((m,), l.dtype))


def _dense_weights_one(q, k, beta, key_bias, alibi, causal, logits, sinkhorn_iters):
    l = _dense_logits(q, k, beta, key_bias, alibi, causal, logits)
    if sinkhorn_iters:
        l = l + _sinkhorn_dense(l, sinkhorn_iters)[None, :]
    return jax.nn.softmax(l, axis=-1)


def attention_weights(q, k, beta, *, key_bias=None, alibi=None, causal=False, logits="dot",
                      sinkhorn_iters=0):
    """The dense weights ``w_ij`` of every head, (H, n, m), for ``q`` (H, n, p), ``k`` (H, m, p),
    ``key_bias`` (H, m) or None, ``alibi`` (H,) or None (module doc)."""
    _check_variant(q, k, None, key_bias, alibi, causal, logits, sinkhorn_iters)
    beta = jnp.asarray(beta, q.dtype)
    return jax.vmap(_dense_weights_one, in_axes=(0, 0, None, _ax(key_bias), _ax(alibi), None,
                                                   None, None))(
        q, k, beta, key_bias, alibi, causal, logits, int(sinkhorn_iters))


def _ax(a):
    return None if a is None else 0


def _check_variant(q, k, v, key_bias, alibi, causal, logits, sinkhorn_iters):
    _check_choice("logits", logits, LOGITS)
    if getattr(q, "ndim", None) != 3 or getattr(k, "ndim", None) != 3 or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2]:
        raise ValueError("expected q (H, n, p) and k (H, m, p) with the same H and p; got "
                         f"{getattr(q, 'shape', q)} and {getattr(k, 'shape', k)}")
    H, n, _ = q.shape
    m = k.shape[1]
    if v is not None and (getattr(v, "ndim", None) != 2 or v.shape[0] != m):
        raise ValueError(f"v must have shape ({m}, e) (the values shared by all heads), got "
                         f"{getattr(v, 'shape', v)}")
    if key_bias is not None and key_bias.shape != (H, m):
        raise ValueError(f"key_bias must have shape ({H}, {m}), got {key_bias.shape}")
    if alibi is not None and jnp.shape(alibi) != (H,):
        raise ValueError(f"alibi must hold one slope per head, shape ({H},), got "
                         f"{jnp.shape(alibi)}")
    if causal and n != m:
        raise ValueError(f"a causal mask needs as many queries as keys (self-attention); got "
                         f"{n} queries and {m} keys")
    if isinstance(sinkhorn_iters, bool) or not hasattr(sinkhorn_iters, "__index__") \
            or int(sinkhorn_iters) < 0:
        raise ValueError(f"sinkhorn_iters must be an integer >= 0, got {sinkhorn_iters!r}")
    if causal and sinkhorn_iters:
        raise ValueError("Sinkhorn attention takes no causal mask (a lower-triangular doubly "
                         "stochastic matrix is the identity)")


def heads_interaction(q, k, v, beta, *, key_bias=None, alibi=None, causal=False, logits="dot",
                      sinkhorn_iters=0, kernel="auto", k_block=None, q_block=None):
    """Attention averages of every head, ``m_hi = Σ_j w^h_ij v_j`` (module doc).

    Args:
      q: queries (H, n, p) (RoPE already applied); k: keys (H, m, p); v: values (m, e),
        shared by the heads.
      beta: inverse temperature, scalar.
      key_bias: (H, m) or None; alibi: ALiBi slopes (H,) or None; causal: j ≤ i only.
      logits: ``"dot"`` | ``"l2"``; sinkhorn_iters: 0 (softmax rows) or the number of
        Sinkhorn sweeps.
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"``; k_block, q_block: block sizes (None:
        the platform default; under a causal mask the CPU query block is ``CAUSAL_Q_BLOCK``).

    Returns:
      (H, n, e).
    """
    _check_variant(q, k, v, key_bias, alibi, causal, logits, sinkhorn_iters)
    k_block = _check_block("k_block", k_block)
    q_block = _check_block("q_block", q_block)
    kernel = resolve_kernel(kernel, k.shape[1])
    # one program a call shape when called eagerly (inlined under a caller's jit)
    return _heads_jit(q, k, v, beta, key_bias, alibi, causal=bool(causal), logits=logits,
                      iters=int(sinkhorn_iters), kernel=kernel, k_block=k_block, q_block=q_block)


@functools.partial(jax.jit, static_argnames=("causal", "logits", "iters", "kernel", "k_block",
                                             "q_block"))
def _heads_jit(q, k, v, beta, key_bias, alibi, *, causal, logits, iters, kernel, k_block,
               q_block):
    beta = jnp.asarray(beta, q.dtype)
    v = v.astype(q.dtype)
    if kernel == "dense":
        w = jax.vmap(_dense_weights_one, in_axes=(0, 0, None, _ax(key_bias), _ax(alibi), None,
                                                  None, None))(
            q, k, beta, key_bias, alibi, causal, logits, iters)
        return jnp.einsum("hnm,me->hne", w, v, precision=HIGHEST)
    if logits == "l2":  # −β|q − k|² = row constant + 2β⟨q, k⟩ − β|k|²
        qs = 2 * beta * q
        kb_l2 = -beta * jnp.sum(k * k, axis=-1)
        key_bias = kb_l2 if key_bias is None else key_bias + kb_l2
    else:
        qs = beta * q
    if key_bias is None:
        key_bias = jnp.zeros(k.shape[:2], q.dtype)
    alibi_ = jnp.zeros((q.shape[0],), q.dtype) if alibi is None else jnp.asarray(alibi, q.dtype)
    kb, qb = _variant_blocks(k_block, q_block, causal)
    if iters:
        key_bias = key_bias + jax.vmap(
            lambda a, b, c, s: _sinkhorn_blocked(a, b, c, s, alibi is not None, iters, kb, qb))(
            qs, k, key_bias, alibi_)
    one = functools.partial(_attend_blocked, causal=causal, use_alibi=alibi is not None,
                            k_block=kb, q_block=qb)
    return jax.vmap(one, in_axes=(0, 0, None, 0, 0))(qs, k, v, key_bias, alibi_)


def _variant_blocks(k_block, q_block, causal):
    plat = "cpu" if jax.default_backend() == "cpu" else "gpu"
    kb, qb = DEFAULT_BLOCKS[plat]
    if causal and plat == "cpu":
        qb = CAUSAL_Q_BLOCK
    return (kb if k_block is None else k_block), (qb if q_block is None else q_block)


def _attend_blocked(qs, k, v, bias, alibi, *, causal, use_alibi, k_block, q_block):
    ref, acc = _blocked_core(qs, k, v, bias, alibi, causal, use_alibi, k_block, q_block)
    e = v.shape[1]
    return acc[:, :e] / acc[:, e:]


def _row_lse(qs, k, bias, alibi, use_alibi, kb, qb):
    ref, acc = _blocked_core(qs, k, jnp.zeros((k.shape[0], 0), qs.dtype), bias, alibi, False,
                             use_alibi, kb, qb)
    return ref + jnp.log(acc[:, 0])


def _sinkhorn_blocked(qs, k, bias, alibi, use_alibi, iters, kb, qb):
    """The column potential g of ``iters`` Sinkhorn sweeps (module doc), streamed: row sums
    over key blocks, column sums with the roles of queries and keys swapped."""
    n, m = qs.shape[0], k.shape[0]
    shift = jnp.log(jnp.asarray(n / m, qs.dtype))  # columns to n/m (see _sinkhorn_dense)

    def sweep(_, g):
        f = -_row_lse(qs, k, bias + g, alibi, use_alibi, kb, qb)
        return -(_row_lse(k, qs, f, alibi, use_alibi, kb, qb) + bias) + shift

    return jax.lax.fori_loop(0, iters, sweep, jnp.zeros((m,), qs.dtype))


def _blocked_core(qs, k, v, bias, alibi, causal, use_alibi, k_block, q_block):
    """Online softmax of ``l_ij = ⟨qs_i, k_j⟩ + bias_j − alibi |i − j|`` (j ≤ i if causal)
    over key blocks: returns (reference ref_i, Σ_j e^{l_ij − ref_i} [v_j, 1]), so that
    ``m_i = acc[:e] / acc[e]`` and ``lse_i = ref_i + log acc[e]``."""
    n, p = qs.shape
    m, e = v.shape
    dtype = qs.dtype
    kb = max(1, min(int(k_block), m))
    qb = max(1, min(int(q_block), n))
    keys, nkb = pad_rows(k.astype(dtype), kb)
    vals, _ = pad_rows(jnp.concatenate([v, jnp.ones((m, 1), dtype)], axis=1), kb)
    bias_p, _ = pad_rows(bias.astype(dtype), kb, value=-jnp.inf)  # padded keys: weight 0
    keys = keys.reshape(nkb, kb, p)
    vals = vals.reshape(nkb, kb, e + 1)
    bias_p = bias_p.reshape(nkb, kb)
    starts = jnp.arange(nkb) * kb

    def one_query_block(q, q0):
        rows = q.shape[0]
        ipos = q0 + jnp.arange(rows)

        def compute(carry, yk, vk, bk, j0):
            mx, acc = carry
            l = jnp.matmul(q, yk.T, precision=HIGHEST) + bk[None, :]
            jpos = j0 + jnp.arange(kb)
            if use_alibi:
                l = l - alibi * jnp.abs(ipos[:, None] - jpos[None, :]).astype(dtype)
            if causal:
                l = jnp.where(jpos[None, :] <= ipos[:, None], l, -jnp.inf)
            new = jnp.maximum(mx, jnp.max(l, axis=-1))
            ref = jnp.where(jnp.isfinite(new), new, jnp.zeros((), dtype))
            oref = jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), dtype))
            scale = jnp.where(jnp.isfinite(mx), jnp.exp(oref - ref), jnp.zeros((), dtype))
            w = jnp.exp(l - ref[:, None])
            return new, acc * scale[:, None] + jnp.matmul(w, vk, precision=HIGHEST)

        def body(carry, blk):
            yk, vk, bk, j0 = blk
            if causal:  # key blocks wholly after the block's last query: skipped
                carry = jax.lax.cond(j0 <= q0 + rows - 1,
                                     lambda c: compute(c, yk, vk, bk, j0), lambda c: c, carry)
            else:
                carry = compute(carry, yk, vk, bk, j0)
            return carry, None

        init = (jnp.full((rows,), -jnp.inf, dtype), jnp.zeros((rows, e + 1), dtype))
        (mx, acc), _ = jax.lax.scan(body, init, (keys, vals, bias_p, starts))
        return jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), dtype)), acc

    if n <= qb:
        return one_query_block(qs, jnp.zeros((), starts.dtype))
    qp, nqb = pad_rows(qs, qb)
    ref, acc = jax.lax.map(lambda a: one_query_block(*a),
                           (qp.reshape(nqb, qb, p), jnp.arange(nqb) * qb))
    return ref.reshape(nqb * qb)[:n], acc.reshape(nqb * qb, e + 1)[:n]
