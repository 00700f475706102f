"""Online log-sum-exp tiles shared by the Sinkhorn geometries (dense online and block-sparse).

``eps * lse_j((pot_j − |p_i − o_j|²)/eps)`` for every point ``p_i``, streamed over key blocks
with a running maximum: memory O(q_block · k_block), never N × M.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._attention import pad_rows


def _sq_dists(u, v):
    """|u_i - v_j|^2 by differences (no |u|^2 + |v|^2 - 2 u.v cancellation, no matmul)."""
    return jnp.sum((u[:, None, :] - v[None, :, :]) ** 2, axis=-1)


#: key-block size of the online log-sum-exp (points of the other cloud per block).
LSE_K_BLOCK = 512


def lse_key_block() -> int:
    """Key block of the online geometry: cache-sized on CPU, 8x larger on accelerators."""
    return LSE_K_BLOCK if jax.default_backend() == "cpu" else 8 * LSE_K_BLOCK


def lse_tile(q, keys, pot, inv, carry):
    """One tile of the online log-sum-exp of ``(pot_k − |keys_k − q_i|^2) · inv``: folds the
    tile's terms into the running (maximum, rescaled sum) ``carry`` of every row q_i. The
    cost by differences, ``Σ_c (k_c − q_c)^2``; ``pot = −inf`` terms contribute nothing."""
    mx, s = carry
    d = q.shape[1]
    cost = (q[:, None, 0] - keys[None, :, 0]) ** 2
    for c in range(1, d):
        cost = cost + (q[:, None, c] - keys[None, :, c]) ** 2
    logits = (pot[None, :] - cost) * inv
    new = jnp.maximum(mx, jnp.max(logits, axis=1))
    ref = jnp.where(jnp.isfinite(new), new, jnp.zeros((), q.dtype))
    s = s * jnp.exp(mx - ref) + jnp.sum(jnp.exp(logits - ref[:, None]), axis=1)
    return new, s


def blocked_lse(pts, other, pot, eps, *, q_block: int = 1024, k_block: int = LSE_K_BLOCK):
    r"""``eps · log Σ_k exp((pot_k − |other_k − p|^2) / eps)`` for every row ``p`` of ``pts``.

    The Sinkhorn kernel of the squared-Euclidean cost, computed tile by tile: rows in
    blocks of ``q_block``, the other cloud in blocks of ``k_block`` with a running maximum
    and a rescaled running sum (the online log-sum-exp of the attention kernels). Nothing
    of size N x M is ever formed: memory O(q_block · k_block), and the program (hence the
    compile time) does not grow with N or M. The cost is formed by differences,
    ``Σ_c (o_c − p_c)^2``, never as ``|o|^2 + |p|^2 − 2 o·p``: at the small ε of
    concentrated clouds (ε ~ 1e-6 against |x|^2 = 1) the cancellation of the expanded form
    would move the exponents by O(1).

    ``pot = −inf`` entries (and the padding of the last block) contribute nothing; a row
    whose terms are all ``−inf`` gives ``−inf``.
    """
    n, d = pts.shape
    m = other.shape[0]
    dtype = pts.dtype
    kb = max(1, min(int(k_block), m))
    qb = max(1, min(int(q_block), n))
    other_p, nk = pad_rows(other, kb)
    pot_p, _ = pad_rows(pot.astype(dtype), kb, value=-jnp.inf)
    other_p = other_p.reshape(nk, kb, d)
    pot_p = pot_p.reshape(nk, kb)
    inv = 1.0 / eps

    def rows(q):
        def step(carry, block):
            return lse_tile(q, block[0], block[1], inv, carry), None

        rb = q.shape[0]
        init = (jnp.full((rb,), -jnp.inf, dtype), jnp.zeros((rb,), dtype))
        (mx, s), _ = jax.lax.scan(step, init, (other_p, pot_p))
        return eps * (mx + jnp.log(s))

    if n <= qb:
        return rows(pts)
    pts_p, nq = pad_rows(pts, qb)
    return jax.lax.map(rows, pts_p.reshape(nq, qb, d)).reshape(nq * qb)[:n]
