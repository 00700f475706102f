r"""A blocked softmax attention whose reverse pass is blocked too (the kernel of the measure control).

For queries ``q`` (n, p), keys ``k`` (m, p), values ``v`` (m, e) and a per-key bias ``c`` (m,),

    out_i = Σ_j w_ij v_j,   w_ij = exp(l_ij) / Σ_k exp(l_ik),   l_ij = q_i · k_j + c_j,

computed one (query block × key block) tile at a time with the running maximum (the online
softmax): memory O(q_block · k_block), never O(n · m). Its derivative is a ``jax.custom_vjp``
that recomputes the tiles (the flash-attention backward pass): with ``D_i = g_i · out_i`` and
``s_ij = w_ij (g_i · v_j − D_i)`` (g the cotangent of out),

    ∂q_i = Σ_j s_ij k_j,   ∂k_j = Σ_i s_ij q_i,   ∂v_j = Σ_i w_ij g_i,   ∂c_j = Σ_i s_ij,

one pass over the key blocks of each query block (∂q) and one over the query blocks of each
key block (∂k, ∂v, ∂c); the residuals are the inputs, the output and the rows' log-sum-exp,
O((n + m)(p + e)).

Why not reverse mode through :func:`jaxdyn.kernels.interaction`: its blocked kernel is a
``lax.scan`` over key blocks without a custom derivative, so reverse mode keeps every tile's
exponentials: one gradient of a blocked interaction at N = 10⁴, d = 3 (float32, a loaded
2-core CPU, each in its own process) peaked at 1.70 GB of resident memory (the N² = 10⁸ stored
exponentials) and took 2.3 s, against 0.31 GB and 1.1 s for this kernel, of which about 0.28 GB
is the process's own footprint (``benchmarks/bench_control_measure.py --kernel-memory``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST

#: default tiles on CPU (query rows, keys): 1024 x 512 float64 tiles (4 MiB) stream through the
#: cache; the reverse pass holds two such tiles at a time.
Q_BLOCK = 1024
K_BLOCK = 512


def _pad(a, block, value):
    """(n, ...) → (nb, block, ...), the last block padded with ``value``."""
    n = a.shape[0]
    nb = max(1, math.ceil(n / block))
    pad = nb * block - n
    if pad:
        a = jnp.concatenate([a, jnp.full((pad,) + a.shape[1:], value, a.dtype)], axis=0)
    return a.reshape((nb, block) + a.shape[1:])


def _unpad(a, n):
    """(nb, block, ...) → (n, ...)."""
    return a.reshape((-1,) + a.shape[2:])[:n]


def _blocks(n, m, q_block, k_block):
    """Block sizes clipped to the sizes."""
    return max(1, min(int(q_block), n)), max(1, min(int(k_block), m))


def _forward(q, k, v, c, q_block, k_block):
    """(out, lse): the attention average and each row's log-sum-exp."""
    n, m = q.shape[0], k.shape[0]
    qb, kb = _blocks(n, m, q_block, k_block)
    Qb = _pad(q, qb, 0)
    Kb, Vb = _pad(k, kb, 0), _pad(v, kb, 0)
    Cb = _pad(c, kb, -jnp.inf)  # padded keys carry no weight

    def rows(qr):
        def step(carry, blk):
            mx, s, acc = carry
            kk, vv, cc = blk
            lg = jnp.matmul(qr, kk.T, precision=HIGHEST) + cc[None, :]
            new = jnp.maximum(mx, jnp.max(lg, axis=1))
            scale = jnp.exp(mx - new)
            p = jnp.exp(lg - new[:, None])
            return (new, s * scale + jnp.sum(p, axis=1),
                    acc * scale[:, None] + jnp.matmul(p, vv, precision=HIGHEST)), None

        init = (jnp.full((qr.shape[0],), -jnp.inf, q.dtype), jnp.zeros((qr.shape[0],), q.dtype),
                jnp.zeros((qr.shape[0], v.shape[1]), q.dtype))
        (mx, s, acc), _ = jax.lax.scan(step, init, (Kb, Vb, Cb))
        return acc / s[:, None], mx + jnp.log(s)

    out, lse = jax.lax.map(rows, Qb)
    return _unpad(out, n), _unpad(lse, n)


def attend(q, k, v, c, q_block: int = Q_BLOCK, k_block: int = K_BLOCK):
    """Softmax attention ``Σ_j softmax_j(q_i · k_j + c_j) v_j`` in tiles, forward and reverse.

    Args:
        q: (n, p) queries (pre-scaled).
        k: (m, p) keys.
        v: (m, e) values.
        c: (m,) per-key bias of the logits.
        q_block: query rows per tile.
        k_block: keys per tile.

    Returns:
        (n, e) the averages, in the inputs' promoted dtype.
    """
    dtype = jnp.result_type(q, k, v, c)
    q, k, v, c = (jnp.asarray(a, dtype) for a in (q, k, v, c))
    return _attend(q, k, v, c, int(q_block), int(k_block))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attend(q, k, v, c, q_block, k_block):
    """:func:`attend` on inputs of one dtype (its custom derivative)."""
    return _forward(q, k, v, c, q_block, k_block)[0]


def _attend_fwd(q, k, v, c, q_block, k_block):
    out, lse = _forward(q, k, v, c, q_block, k_block)
    return out, (q, k, v, c, out, lse)


def _attend_bwd(q_block, k_block, res, g):
    q, k, v, c, out, lse = res
    n, m = q.shape[0], k.shape[0]
    qb, kb = _blocks(n, m, q_block, k_block)
    D = jnp.sum(g * out, axis=1)
    # padded query rows have g = 0 and lse = +inf, padded keys a bias of -inf: weight 0
    Qb, Gb, Lb, Db = _pad(q, qb, 0), _pad(g, qb, 0), _pad(lse, qb, jnp.inf), _pad(D, qb, 0)
    Kb, Vb, Cb = _pad(k, kb, 0), _pad(v, kb, 0), _pad(c, kb, -jnp.inf)

    def tile(qr, gr, lr, dr, kk, vv, cc):
        lg = jnp.matmul(qr, kk.T, precision=HIGHEST) + cc[None, :]
        p = jnp.exp(lg - lr[:, None])
        s = p * (jnp.matmul(gr, vv.T, precision=HIGHEST) - dr[:, None])
        return p, s

    def dq_rows(args):
        qr, gr, lr, dr = args

        def step(acc, blk):
            kk, vv, cc = blk
            _, s = tile(qr, gr, lr, dr, kk, vv, cc)
            return acc + jnp.matmul(s, kk, precision=HIGHEST), None

        return jax.lax.scan(step, jnp.zeros_like(qr), (Kb, Vb, Cb))[0]

    def dkv_cols(args):
        kk, vv, cc = args

        def step(acc, blk):
            qr, gr, lr, dr = blk
            p, s = tile(qr, gr, lr, dr, kk, vv, cc)
            dk, dv, dc = acc
            return (dk + jnp.matmul(s.T, qr, precision=HIGHEST),
                    dv + jnp.matmul(p.T, gr, precision=HIGHEST), dc + jnp.sum(s, axis=0)), None

        init = (jnp.zeros_like(kk), jnp.zeros_like(vv), jnp.zeros(kk.shape[:1], k.dtype))
        return jax.lax.scan(step, init, (Qb, Gb, Lb, Db))[0]

    dq = _unpad(jax.lax.map(dq_rows, (Qb, Gb, Lb, Db)), n)
    dk, dv, dc = jax.lax.map(dkv_cols, (Kb, Vb, Cb))
    return dq, _unpad(dk, m), _unpad(dv, m), _unpad(dc, m)


_attend.defvjp(_attend_fwd, _attend_bwd)
