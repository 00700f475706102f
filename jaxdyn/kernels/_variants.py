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

The blocked kernel is the online softmax / log-sum-exp of :mod:`._online`, the same core as
:func:`~jaxdyn.kernels.interaction`'s (one head, no bias, no mask: the same program). On CPU
the weights are shifted by a bound of the row's logits where that is exact and safe: the
Cauchy–Schwarz bound ``|β q_i| max_j |k_j| + max_j b_j`` (for L2 logits the smaller of it and
``β|q_i|² + max_j b_j``, from ``−β|q_i − k_j|² ≤ 0``), checked per query block against the
diagonal logit ``l_ii`` for self-attention (n = m: never masked, a causal row keeps j = i) or
the maximum of the first key block (key 0: never masked); otherwise, and on accelerators, the
running maximum (with a −∞-safe reference: a row may see no unmasked key in a block). Under a
causal mask the bound's maxima run over j ≤ i and each row takes its own choice: row i's
average depends on the particles j ≤ i only, bitwise. Under a
causal mask a query block never visits a key block that lies wholly after its last query;
on CPU it masks only the key blocks across its diagonal, by sub-blocks of as many rows as a
key block (:mod:`._online`), so a causal pass costs about half a full one
(``benchmarks/bench_causal.py``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._checks import any_nonfinite, nan_where, real_arrays, scalar_domain
from ..choices import MASKS
from ._attention import DEFAULT_BLOCKS, HIGHEST, _check_block, _choice_error, _guard, resolve_kernel
from ._online import FUSED_MAX_D, bound, query_positions, ratio, sums

__all__ = ["CAUSAL_LARGE_N", "CAUSAL_Q_BLOCK", "MASKS", "attention_weights", "default_rope_freqs",
           "heads_interaction", "rope",
           "sinkhorn_key_bias"]

LOGITS = ("dot", "l2")
#: CPU query block under a causal mask: small enough that most query blocks skip key blocks
CAUSAL_Q_BLOCK = 1024
#: from this many queries on, the CPU causal query block is 2 · CAUSAL_Q_BLOCK: wider unmasked
#: tiles pay off at large N (``benchmarks/bench_causal.py --q-block``; the diagonal goes by
#: sub-blocks of a key block's rows whatever the query block, ``._online``)
CAUSAL_LARGE_N = 8192


def rope(z, freqs, positions=None):
    """Rotary position embedding (Su et al. 2021).

    Rotates the coordinate pairs (z_{2c}, z_{2c+1}) of row i by the angle
    ``positions_i · freqs_c`` (c < p // 2; an odd last coordinate is left alone). Since
    ``R(θ_i)ᵀ R(θ_j) = R(θ_j − θ_i)``, ``⟨rope(q)_i, rope(k)_j⟩`` depends on i − j only.

    Args:
      z: (..., n, p) vectors.
      freqs: (p // 2,) frequencies.
      positions: (n,) positions; None: 0..n−1.

    Returns:
      The rotated vectors, shaped like ``z``.

    Raises:
      ValueError: ``freqs`` not of shape (p // 2,).
    """
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
    """RoPE's frequencies ``base^(−2c/p)``, c = 0..p//2 − 1 (Su et al. 2021).

    Args:
      p: head dimension.
      base: the frequency base, finite and > 0. A traced value outside the domain gives NaN.
      dtype: floating dtype of the result.

    Returns:
      (p // 2,) frequencies.

    Raises:
      ValueError: ``p`` not an integer ≥ 1, or a concrete base that is not finite and > 0.
    """
    from ..models._params import Domain, check_domain  # the models' shared parameter checks

    if isinstance(p, bool) or not hasattr(p, "__index__") or int(p) < 1:
        raise ValueError(f"p (the head dimension) must be an integer >= 1, got {p!r}")
    check_domain("base", base, Domain("positive", 0, "RoPE base"))
    _, bad = scalar_domain("base", base, low=0, low_open=True)
    return nan_where(bad, jnp.asarray(base, dtype) ** (-2.0 * jnp.arange(p // 2, dtype=dtype) / p))


def _dense_logits(q, k, beta, key_bias, alibi, causal, logits, q_offset=None):
    """The (n, m) logits of one head (module doc), the squared distances by differences."""
    if logits == "l2":
        d2 = jnp.sum((q[:, None, :] - k[None, :, :]) ** 2, axis=-1)
        l = -beta * d2
    else:
        l = beta * jnp.matmul(q, k.T, precision=HIGHEST)
    n, m = l.shape
    if key_bias is not None:
        l = l + key_bias[None, :]
    i = query_positions(n, q_offset)[:, None]
    j = jnp.arange(m)[None, :]
    if alibi is not None:
        l = l - alibi * jnp.abs(i - j).astype(l.dtype)
    if causal:
        l = jnp.where(j <= i, l, -jnp.inf)
    return l


def _sinkhorn_dense(l, iters):
    """The column potential g of ``iters`` log-domain Sinkhorn sweeps on dense logits."""
    n, m = l.shape
    # columns to n/m (rows to 1: both total n). log(m/n), used before, asked the columns for
    # m/n: g drifted by 2 log(m/n) a sweep (cancelled by the row normalisation, but float32 lost
    # the digits of l + g)
    shift = jnp.log(jnp.asarray(n / m, l.dtype))

    def sweep(_, g):
        f = -jax.nn.logsumexp(l + g[None, :], axis=1)
        return -jax.nn.logsumexp(l + f[:, None], axis=0) + shift

    return jax.lax.fori_loop(0, iters, sweep, jnp.zeros((m,), l.dtype))


def _dense_weights_one(q, k, beta, key_bias, alibi, causal, logits, sinkhorn_iters,
                       q_offset=None):
    """The dense (n, m) weights of one head (query row i at position ``q_offset + i``)."""
    l = _dense_logits(q, k, beta, key_bias, alibi, causal, logits, q_offset)
    if sinkhorn_iters:
        l = l + _sinkhorn_dense(l, sinkhorn_iters)[None, :]
    return jax.nn.softmax(l, axis=-1)


def attention_weights(q, k, beta, *, key_bias=None, alibi=None, causal=False, logits="dot",
                      sinkhorn_iters=0):
    """The dense weights ``w_ij`` of every head (module doc).

    ``w_ij = exp(l_ij) / Σ_k exp(l_ik)`` with ``l_ij = β⟨q_i, k_j⟩ + b_j − α|i − j|`` (or
    ``−β|q_i − k_j|² + …``; ``−∞`` above the diagonal under a causal mask), after
    ``sinkhorn_iters`` Sinkhorn sweeps when that is not 0.

    Args:
      q: (H, n, p) queries.
      k: (H, m, p) keys.
      beta: inverse temperature, a finite scalar >= 0. A traced value outside the domain
        gives NaN.
      key_bias: (H, m) per-key bias, or None.
      alibi: (H,) ALiBi slopes, or None.
      causal: mask ``j > i``.
      logits: ``"dot"`` | ``"l2"``.
      sinkhorn_iters: 0 (softmax rows) or the number of Sinkhorn sweeps.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the other inputs (JAX's default float where none is a float); complex is refused (a
    TypeError naming the parameter).

    Returns:
      (H, n, m) weights; NaN where ``q`` or ``k`` holds a NaN or inf (a ``−inf`` key is not a
      mask: pass ``key_bias`` for that).

    Raises:
      ValueError: shapes that do not match, an unknown ``logits``, a causal mask with
        n ≠ m or with Sinkhorn sweeps, a negative ``sinkhorn_iters``, or a ``beta`` that is
        not a scalar (or, concrete, negative or not finite).
    """
    q, k, key_bias, alibi = real_arrays(half=True, q=q, k=k, key_bias=key_bias, alibi=alibi)
    err = _variant_error(q, k, None, key_bias, alibi, causal, logits, sinkhorn_iters)
    beta_err, bad, beta = _beta_domain(beta)
    if err or beta_err:
        raise ValueError(err or beta_err)
    beta = jnp.asarray(beta, q.dtype)
    return nan_where((bad, any_nonfinite(q, k)), jax.vmap(
        _dense_weights_one, in_axes=(0, 0, None, _ax(key_bias), _ax(alibi), None, None, None))(
        q, k, beta, key_bias, alibi, causal, logits, int(sinkhorn_iters)))


def _ax(a):
    """``vmap``'s axis of an optional per-head argument."""
    return None if a is None else 0


def _beta_domain(beta):
    """β's domain (a finite scalar >= 0) checked; a traced invalid β replaced by 1.

    Returns:
      ``(message, bad, beta)``: a concrete β's ValueError message (None if fine), the flag
      of a traced β out of the domain (None for a concrete one) and β to compute with.
    """
    if jnp.ndim(beta) != 0:
        return (f"beta must be a scalar (vmap over a stack for several), got shape "
                f"{jnp.shape(beta)}"), None, beta
    err, bad = scalar_domain("beta", beta, low=0, what=" (inverse temperature)")
    return err, bad, (beta if bad is None else jnp.where(bad, 1, beta))


def _variant_error(q, k, v, key_bias, alibi, causal, logits, sinkhorn_iters):
    """The message of the variants' structural checks (a ValueError), or None."""
    if logits not in LOGITS:
        return _choice_error("logits", logits, LOGITS)
    if getattr(q, "ndim", None) != 3 or getattr(k, "ndim", None) != 3 or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2]:
        return ("expected q (H, n, p) and k (H, m, p) with the same H and p; got "
                f"{getattr(q, 'shape', q)} and {getattr(k, 'shape', k)}")
    H, n, _ = q.shape
    m = k.shape[1]
    if v is not None and (getattr(v, "ndim", None) != 2 or v.shape[0] != m):
        return (f"v must have shape ({m}, e) (the values shared by all heads), got "
                f"{getattr(v, 'shape', v)}")
    if key_bias is not None and jnp.shape(key_bias) != (H, m):
        return f"key_bias must have shape ({H}, {m}), got {jnp.shape(key_bias)}"
    if alibi is not None and jnp.shape(alibi) != (H,):
        return f"alibi must hold one slope per head, shape ({H},), got {jnp.shape(alibi)}"
    if causal and n != m:
        return (f"a causal mask needs as many queries as keys (self-attention); got {n} queries "
                f"and {m} keys")
    if isinstance(sinkhorn_iters, bool) or not hasattr(sinkhorn_iters, "__index__") \
            or int(sinkhorn_iters) < 0:
        return f"sinkhorn_iters must be an integer >= 0, got {sinkhorn_iters!r}"
    if causal and sinkhorn_iters:
        return ("Sinkhorn attention takes no causal mask (a lower-triangular doubly stochastic "
                "matrix is the identity)")
    return None


def heads_interaction(q, k, v, beta, *, key_bias=None, alibi=None, causal=False, logits="dot",
                      sinkhorn_iters=0, kernel="auto", k_block=None, q_block=None,
                      q_offset=None):
    """Attention averages of every head, ``m_hi = Σ_j w^h_ij v_j`` (module doc).

    ``w^h_ij = exp(l^h_ij) / Σ_k exp(l^h_ik)`` with ``l^h_ij = β⟨q_hi, k_hj⟩ + b_hj − α_h|i − j|``
    (or ``−β|q_hi − k_hj|² + …``), ``−∞`` above the diagonal under a causal mask; with
    Sinkhorn sweeps, the key bias gains the column potential g.

    Args:
      q: queries (H, n, p) (RoPE already applied).
      k: keys (H, m, p).
      v: values (m, e), shared by the heads.
      beta: inverse temperature, a finite scalar >= 0. A traced value outside the domain
        gives NaN.
      key_bias: (H, m) per-key bias, or None.
      alibi: ALiBi slopes (H,), or None.
      causal: keys j ≤ i only.
      logits: ``"dot"`` | ``"l2"``.
      sinkhorn_iters: 0 (softmax rows) or the number of Sinkhorn sweeps.
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"``.
      k_block: key block size (None: the platform default).
      q_block: query block size (None: the platform default; under a causal mask the CPU
        query block is ``CAUSAL_Q_BLOCK``, twice that from ``CAUSAL_LARGE_N`` queries).
      q_offset: None (query i is key i's particle: self-attention, n = m under a causal
        mask), or an integer scalar (may be traced): the queries are the particles
        ``q_offset, q_offset + 1, …`` of the keys' cloud (a block of query rows, e.g. one
        device's share), so that positions, masks and the known logit of the bound shift
        refer to those rows. Not with Sinkhorn sweeps (their column sums need every row).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the other inputs (JAX's default float where none is a float); complex is refused (a
    TypeError naming the parameter).

    Returns:
      (H, n, e); NaN where ``q``, ``k`` or ``v`` holds a NaN or inf (a ``−inf`` key is not a
      mask: pass ``key_bias`` for that).

    Raises:
      ValueError: shapes that do not match, an unknown ``logits`` or ``kernel``, a causal
        mask with n ≠ m (without ``q_offset``) or with Sinkhorn sweeps, Sinkhorn sweeps with
        a ``q_offset``, a negative ``sinkhorn_iters``, a block size that is not a
        positive integer, or a ``beta`` that is not a scalar (or, concrete, negative or not
        finite).
    """
    q, k, v, key_bias, alibi = real_arrays(half=True, q=q, k=k, v=v, key_bias=key_bias,
                                           alibi=alibi)
    err, bad, beta = _heads_domain(q, k, v, beta, key_bias, alibi, causal, logits,
                                   sinkhorn_iters, q_offset)
    if err:
        raise ValueError(err)
    return nan_where((bad, any_nonfinite(q, k, v)), _heads_run(
        q, k, v, beta, key_bias, alibi, causal, logits, sinkhorn_iters, kernel, k_block,
        q_block, q_offset))


def _heads_interaction(q, k, v, beta, *, key_bias=None, alibi=None, causal=False, logits="dot",
                       sinkhorn_iters=0, kernel="auto", k_block=None, q_block=None,
                       q_offset=None):
    """:func:`heads_interaction` unchecked and unflagged (the models' fields, every step)."""
    err, bad, beta = _heads_domain(q, k, v, beta, key_bias, alibi, causal, logits,
                                   sinkhorn_iters, q_offset)
    if err:
        raise ValueError(err)
    return nan_where(bad, _heads_run(q, k, v, beta, key_bias, alibi, causal, logits,
                                     sinkhorn_iters, kernel, k_block, q_block, q_offset))


def _heads_domain(q, k, v, beta, key_bias, alibi, causal, logits, sinkhorn_iters, q_offset):
    """``(message, bad, beta)``: :func:`heads_interaction`'s structural checks and β's domain."""
    err = _variant_error(q, k, v, key_bias, alibi, causal and q_offset is None, logits,
                         sinkhorn_iters)
    if not err and causal and sinkhorn_iters:
        err = ("Sinkhorn attention takes no causal mask (a lower-triangular doubly stochastic "
               "matrix is the identity)")
    if not err and q_offset is not None and sinkhorn_iters:
        err = ("Sinkhorn sweeps need every query row: compute their key bias on the whole "
               "cloud and pass it as key_bias with sinkhorn_iters=0")
    beta_err, bad, beta = _beta_domain(beta)
    return err or beta_err, bad, beta


def _heads_run(q, k, v, beta, key_bias, alibi, causal, logits, sinkhorn_iters, kernel, k_block,
               q_block, q_offset):
    """:func:`heads_interaction` after its checks: the blocks resolved, the program called."""
    kernel, k_block, q_block = _call_blocks(kernel, k_block, q_block, q.shape[1], k.shape[1])
    # one program a call shape when called eagerly (inlined under a caller's jit)
    return _heads_jit(q, k, v, beta, key_bias, alibi, q_offset, causal=bool(causal),
                      logits=logits, iters=int(sinkhorn_iters), kernel=kernel, k_block=k_block,
                      q_block=q_block, safe=_guard(q.dtype))


def sinkhorn_key_bias(q, k, beta, *, key_bias=None, alibi=None, logits="dot", sinkhorn_iters=1,
                      kernel="auto", k_block=None, q_block=None):
    """The key bias of Sinkhorn attention: ``key_bias`` plus every head's column potential g.

    :func:`heads_interaction` with ``sinkhorn_iters = s`` equals it with
    ``key_bias=sinkhorn_key_bias(q, k, …, sinkhorn_iters=s)`` and no sweeps (module doc), so
    that blocks of query rows (``q_offset``) can share the potential of the whole cloud.

    Args:
      q: queries (H, n, p), every row.
      k: keys (H, m, p).
      beta: inverse temperature, a finite scalar >= 0. A traced value outside the domain
        gives NaN.
      key_bias: (H, m) per-key bias, or None.
      alibi: ALiBi slopes (H,), or None.
      logits: ``"dot"`` | ``"l2"``.
      sinkhorn_iters: the number of Sinkhorn sweeps, >= 1.
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"``.
      k_block: key block size (None: the platform default).
      q_block: query block size (None: the platform default).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the other inputs (JAX's default float where none is a float); complex is refused (a
    TypeError naming the parameter).

    Returns:
      (H, m) key bias; NaN where ``q`` or ``k`` holds a NaN or inf.

    Raises:
      ValueError: shapes that do not match or hold no query or key, an unknown ``logits`` or
        ``kernel``, a ``sinkhorn_iters`` that is not an integer >= 1, a bad block size, or a
        ``beta`` that is not a scalar (or, concrete, negative or not finite).
    """
    q, k, key_bias, alibi = real_arrays(half=True, q=q, k=k, key_bias=key_bias, alibi=alibi)
    for name, a in (("q", q), ("k", k)):
        if getattr(a, "ndim", None) == 3 and a.shape[1] == 0:
            raise ValueError(f"{name} must hold at least one row (shape (H, n, p), n >= 1), "
                             f"got shape {tuple(a.shape)}")
    return nan_where(any_nonfinite(q, k), _sinkhorn_key_bias(
        q, k, beta, key_bias=key_bias, alibi=alibi, logits=logits,
        sinkhorn_iters=sinkhorn_iters, kernel=kernel, k_block=k_block, q_block=q_block))


def _sinkhorn_key_bias(q, k, beta, *, key_bias=None, alibi=None, logits="dot", sinkhorn_iters=1,
                       kernel="auto", k_block=None, q_block=None):
    """:func:`sinkhorn_key_bias` unchecked and unflagged (the models' fields)."""
    err = _variant_error(q, k, None, key_bias, alibi, False, logits, sinkhorn_iters)
    if not err and int(sinkhorn_iters) < 1:
        err = f"sinkhorn_iters must be an integer >= 1, got {sinkhorn_iters!r}"
    beta_err, bad, beta = _beta_domain(beta)
    if err or beta_err:
        raise ValueError(err or beta_err)
    kernel, k_block, q_block = _call_blocks(kernel, k_block, q_block, q.shape[1], k.shape[1])
    v = jnp.zeros((k.shape[1], 0), q.dtype)
    g = _heads_jit(q, k, v, beta, key_bias, alibi, None, causal=False, logits=logits,
                   iters=int(sinkhorn_iters), kernel=kernel, k_block=k_block, q_block=q_block,
                   safe=_guard(q.dtype), potential=True)
    return nan_where(bad, g if key_bias is None else key_bias.astype(g.dtype) + g)


@functools.partial(jax.jit, static_argnames=("causal", "logits", "iters", "kernel", "k_block",
                                             "q_block", "safe", "potential"))
def _heads_jit(q, k, v, beta, key_bias, alibi, q_offset, *, causal, logits, iters, kernel,
               k_block, q_block, safe, potential=False):
    """:func:`heads_interaction` after its checks, one program a call shape."""
    # ``potential``: the heads' Sinkhorn column potentials (H, m) instead of the averages
    beta = jnp.asarray(beta, q.dtype)
    v = v.astype(q.dtype)
    if kernel == "dense":
        if potential:
            def pot(qh, kh, bh, ah):
                l = _dense_logits(qh, kh, beta, bh, ah, False, logits)
                return _sinkhorn_dense(l, iters)

            return jax.vmap(pot, in_axes=(0, 0, _ax(key_bias), _ax(alibi)))(q, k, key_bias,
                                                                              alibi)
        w = jax.vmap(_dense_weights_one, in_axes=(0, 0, None, _ax(key_bias), _ax(alibi), None,
                                                  None, None, None))(
            q, k, beta, key_bias, alibi, causal, logits, iters, q_offset)
        return jnp.einsum("hnm,me->hne", w, v, precision=HIGHEST)
    if key_bias is not None:
        key_bias = key_bias.astype(q.dtype)
    if alibi is not None:
        alibi = jnp.asarray(alibi, q.dtype)
    opts = dict(causal=causal, logits=logits, iters=iters, safe=safe, potential=potential)
    kb_c, qb_c = _variant_blocks("cpu", k_block, q_block, causal, q.shape[1])
    kb_g, qb_g = _variant_blocks("gpu", k_block, q_block, causal, q.shape[1])
    accel = "fused" if max(q.shape[2], v.shape[1]) <= FUSED_MAX_D else "dot"
    return jax.lax.platform_dependent(
        q, k, v, beta, key_bias, alibi, q_offset,
        cpu=functools.partial(_heads_blocked, mode="bound", step="dot", k_block=kb_c,
                              q_block=qb_c, over_heads="map", **opts),
        default=functools.partial(_heads_blocked, mode="running", step=accel, k_block=kb_g,
                                  q_block=qb_g, over_heads="vmap", **opts))


def _variant_blocks(platform, k_block, q_block, causal, n):
    """The platform's default blocks where a size is None (CPU causal: ``CAUSAL_Q_BLOCK``)."""
    kb, qb = DEFAULT_BLOCKS[platform]
    if causal and platform == "cpu":
        qb = CAUSAL_Q_BLOCK * (2 if n >= CAUSAL_LARGE_N else 1)
    return (kb if k_block is None else k_block), (qb if q_block is None else q_block)


def _heads_blocked(q, k, v, beta, key_bias, alibi, q_offset, *, causal, logits, iters, mode,
                   step, k_block, q_block, safe, over_heads, potential=False):
    """The blocked kernel of every head, one after the other (``"map"``) or vmapped."""
    # CPU: one head at a time: vmapped over the heads, the (keys × queries) tiles run slower
    # than H passes of one head.
    if logits == "l2":  # −β|q − k|² = row constant + 2β⟨q, k⟩ − β|k|²
        qs = 2 * beta * q
        l2_bias = -beta * jnp.sum(k * k, axis=-1)
        key_bias = l2_bias if key_bias is None else key_bias + l2_bias
    else:
        qs = beta * q
    head = functools.partial(_head_blocked, beta=beta, causal=causal, l2=logits == "l2",
                             iters=iters, mode=mode, step=step, k_block=k_block,
                             q_block=q_block, safe=safe, q_offset=q_offset,
                             potential=potential)
    if q.shape[0] == 1:
        return head(qs[0], k[0], v, None if key_bias is None else key_bias[0],
                    None if alibi is None else alibi[0])[None]
    if over_heads == "map":
        return jax.lax.map(lambda a: head(a[0], a[1], v, a[2], a[3]), (qs, k, key_bias, alibi))
    return jax.vmap(head, in_axes=(0, 0, None, _ax(key_bias), _ax(alibi)))(
        qs, k, v, key_bias, alibi)


def _head_blocked(qs, k, v, bias, alibi, *, beta, causal, l2, iters, mode, step, k_block,
                  q_block, safe, q_offset=None, potential=False):
    """One head: the Sinkhorn column potential (``iters`` sweeps), then the averages."""
    # ``potential``: the column potential alone
    e = v.shape[1]
    # the AM–GM bound is tight for L2 logits (``._online.bound``): s = 1/(2β) for the rows
    amgm = 1 / (2 * beta) if l2 else None
    if iters:
        g = _sinkhorn_blocked(qs, k, bias, alibi, beta=beta, l2=l2, iters=iters, mode=mode,
                              step=step, k_block=k_block, q_block=q_block, safe=safe)
        if potential:
            return g
        bias = g if bias is None else bias + g
    _, acc = _pass(qs, k, v, bias, alibi, amgm=amgm, causal=causal, mode=mode, step=step,
                   k_block=k_block, q_block=q_block, safe=safe, q_offset=q_offset)
    return ratio(acc[:, :e], acc[:, e:])


def _pass(qs, k, v, bias, alibi, *, amgm, causal, mode, step, k_block, q_block, safe,
          q_offset=None):
    """The online core's :func:`~._online.sums` of one head (values ``v`` may have 0 columns)."""
    # with the bound shift's bound and known logit where ``mode`` is "bound"; ``q_offset``:
    # the queries are the rows q_offset, q_offset + 1, ... of the keys' cloud
    n, m = qs.shape[0], k.shape[0]
    r = low = None
    if mode == "bound":
        i = None if q_offset is None else query_positions(n, q_offset)
        r = bound(qs, k, bias, amgm=amgm, causal=causal, qpos=i)
        if alibi is not None:  # −α|i − j| <= max(−α, 0) · max_j |i − j| (j <= i if causal)
            i = jnp.arange(n) if i is None else i
            span = i if causal else jnp.maximum(i, m - 1 - i)
            r = r + jnp.maximum(-alibi, 0) * span.astype(qs.dtype)
        if q_offset is None and n == m:  # the diagonal logit: a logit of row i (j = i)
            low = jnp.sum(qs * k, axis=1) + (0 if bias is None else bias)
        elif q_offset is not None:  # row i's own key (the last key for padded rows)
            i = query_positions(n, q_offset)
            j = jnp.clip(i, 0, m - 1)
            low = jnp.sum(qs * k[j], axis=1) + (0 if bias is None else bias[j])
            if alibi is not None:
                low = low - alibi * jnp.abs(i - j).astype(qs.dtype)
    return sums(qs, k, v, mode=mode, q_block=q_block, k_block=k_block, step=step,
                logits=_cpu_logits(qs.shape[1]), bias=bias, alibi=alibi, r=r, low=low,
                causal=causal, safe=safe, q_offset=q_offset)


def _cpu_logits(p):
    """The CPU fixed-shift tile (``._attention.default_cpu_logits``)."""
    return "fused" if p <= FUSED_MAX_D else "matmul"


def _row_lse(qs, k, bias, alibi, *, amgm, mode, step, k_block, q_block, safe):
    """``log Σ_j exp(⟨qs_i, k_j⟩ + bias_j − α|i − j|)`` of every row, streamed."""
    ref, acc = _pass(qs, k, jnp.zeros((k.shape[0], 0), qs.dtype), bias, alibi, amgm=amgm,
                     causal=False, mode=mode, step=step, k_block=k_block, q_block=q_block,
                     safe=safe)
    return ref + jnp.log(acc[:, 0])


def _sinkhorn_blocked(qs, k, bias, alibi, *, beta, l2, iters, mode, step, k_block, q_block,
                      safe):
    """The column potential g of ``iters`` Sinkhorn sweeps (module doc), streamed."""
    # row sums over key blocks, column sums with the roles of queries and keys swapped
    n, m = qs.shape[0], k.shape[0]
    shift = jnp.log(jnp.asarray(n / m, qs.dtype))  # columns to n/m (see _sinkhorn_dense)
    opts = dict(mode=mode, step=step, k_block=k_block, q_block=q_block, safe=safe)
    # AM–GM scales of the L2 logits: 1/(2β) for the rows, 2β for the columns
    row_s, col_s = (1 / (2 * beta), 2 * beta) if l2 else (None, None)
    b0 = jnp.zeros((m,), qs.dtype) if bias is None else bias

    def sweep(_, g):
        f = -_row_lse(qs, k, b0 + g, alibi, amgm=row_s, **opts)
        return -(_row_lse(k, qs, f, alibi, amgm=col_s, **opts) + b0) + shift

    return jax.lax.fori_loop(0, iters, sweep, jnp.zeros((m,), qs.dtype))


def _call_blocks(kernel, k_block, q_block, n, m):
    """The concrete kernel at ``m`` keys and the checked block sizes, capped at ``m`` and ``n``."""
    k_block = _check_block("k_block", k_block)
    q_block = _check_block("q_block", q_block)
    if kernel == "local":
        raise ValueError("heads_interaction has no kernel='local' (key biases, masks and "
                         "positions are outside its certificate); MultiHeadAttention takes it "
                         "for softmax heads without mask or positions")
    kernel = resolve_kernel(kernel, m)
    return ("blocked" if kernel == "auto_local" else kernel,
            None if k_block is None else min(k_block, m),
            None if q_block is None else min(q_block, n))
