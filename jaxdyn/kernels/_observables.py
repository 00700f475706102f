r"""Statistics of one attention layer's weights, row by row, without an N × M matrix.

For queries ``x_i``, keys ``y_j`` and logits ``l_ij = β x_iᵀ B y_j`` (the kernels'
convention), softmax weights ``w_ij = e^{l_ij} / Σ_k e^{l_ik}``:

- the largest weight ``max_j w_ij`` and the key that takes it (the largest logit; the first
  such key on ties);
- the entropy ``H_i = −Σ_j w_ij log w_ij`` (0 for one key, ``log M`` for uniform weights);
- the effective number of keys ``1 / Σ_j w_ij²`` (between 1 and M);
- the rank of that key among the keys by distance to the query, ``#{j : |x_i − y_j| <
  |x_i − y_{j*}|}`` (0: the nearest key takes the most weight).

Two passes over key blocks per query block. The first keeps a running maximum ``m`` and the
rescaled sums ``s0 = Σ e^{l−m}``, ``s1 = Σ e^{l−m} (l − m)`` and ``s2 = Σ e^{2(l−m)}`` (the
online softmax of ``_online.py``), from which ``max w = 1 / s0``, ``H = log s0 − s1 / s0`` and
``1 / Σ w² = s0² / s2``; the second counts the keys nearer than the top key. Memory
O(q_block · k_block).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .._checks import any_nonfinite, nan_where, real_arrays, scalar_domain
from ._online import HIGHEST, map_query_blocks, pad_rows

__all__ = ["WeightStats", "weight_statistics"]


class WeightStats(NamedTuple):
    """Per-query statistics of softmax attention weights (:func:`weight_statistics`).

    Attributes:
      max_weight: (n,) ``max_j w_ij``.
      entropy: (n,) ``−Σ_j w_ij log w_ij`` (natural log).
      effective_keys: (n,) ``1 / Σ_j w_ij²``.
      top_key: (n,) int32, the key with the largest weight.
      top_rank: (n,) int32, the number of keys strictly nearer to the query than that key
        (Euclidean distance between ``x_i`` and ``y_j``).
    """

    max_weight: jax.Array
    entropy: jax.Array
    effective_keys: jax.Array
    top_key: jax.Array
    top_rank: jax.Array


def weight_statistics(x, y=None, B=None, beta=1.0, *, q_block: int = 256, k_block: int = 2048,
                      logits: str = "inner"):
    """Largest weight, entropy, effective number of keys and the top key's rank, per query.

    Args:
      x: (n, d) queries (and positions for the rank).
      y: (m, d) keys (None: ``x``, self-attention).
      B: (d, d) the bilinear form ``QᵀK`` of the logits ``β x_iᵀ B y_j`` (None: identity).
      beta: inverse temperature, finite and ≥ 0 (a scalar; a traced value outside that domain
        gives NaN statistics and −1 keys and ranks).
      q_block: queries per block.
      k_block: keys per block.
      logits: ``"inner"`` (``β x_iᵀ B y_j``) or ``"distance"`` (``−β |x_i − y_j|²/2``, B = I
        only): on the unit sphere the two differ by the row constant β and give the same
        weights, but the distance form keeps its precision for keys very near the query
        (``1 − x·y`` rounds to a multiple of the dtype's ε, ``|x − y|²`` does not).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the other inputs (JAX's default float where none is a float); complex is refused (a
    TypeError naming the parameter).

    Returns:
      :class:`WeightStats` (NaN statistics and −1 keys and ranks where ``x``, ``y`` or ``B``
      holds a NaN or inf).

    Raises:
      ValueError: shapes that disagree or hold no point, blocks below 1, an unknown
        ``logits``, ``B`` with ``logits="distance"``, or a concrete ``beta`` that is negative
        or not finite.
    """
    x, y, B = real_arrays(half=True, fn="weight_statistics", x=x, y=y, B=B)
    y = x if y is None else y
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"weight_statistics: x (n, d) and y (m, d) must share d; got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError(f"weight_statistics: x and y must hold at least one point each; got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    d = x.shape[1]
    if B is not None and tuple(B.shape) != (d, d):
        raise ValueError(f"weight_statistics: B must have shape ({d}, {d}), got "
                         f"{tuple(B.shape)}")
    if int(q_block) < 1 or int(k_block) < 1:
        raise ValueError(f"weight_statistics: q_block and k_block must be at least 1, got "
                         f"{q_block} and {k_block}")
    if logits not in ("inner", "distance"):
        raise ValueError(f"weight_statistics: logits must be 'inner' or 'distance', got {logits!r}")
    if logits == "distance" and B is not None:
        raise ValueError("weight_statistics: logits='distance' is −β|x − y|²/2 (B = I); pass B=None")
    dtype = jnp.result_type(x.dtype, y.dtype, float)
    x, y = x.astype(dtype), y.astype(dtype)
    B = jnp.eye(d, dtype=dtype) if B is None else jnp.asarray(B, dtype)
    err, bad = scalar_domain("beta", beta, low=0, what=" (inverse temperature)")
    if err:
        raise ValueError(f"weight_statistics: {err}")
    beta = jnp.asarray(beta, dtype)
    out = _stats(x, y, B, beta if bad is None else jnp.where(bad, 1, beta), q_block=int(q_block),
                 k_block=max(1, min(int(k_block), y.shape[0])), distance=logits == "distance")
    return WeightStats(*nan_where((bad, any_nonfinite(x, y, B)), tuple(out)))


@functools.partial(jax.jit, static_argnames=("q_block", "k_block", "distance"))
def _stats(x, y, B, beta, *, q_block, k_block, distance=False):
    m = y.shape[0]
    yp, nk = pad_rows(y, k_block, fill=0)
    blocks = (yp.reshape(nk, k_block, -1),
              jnp.arange(nk * k_block, dtype=jnp.int32).reshape(nk, k_block))
    q_all = beta * jnp.matmul(x, B, precision=HIGHEST)

    def rows(xq, q):
        nb = q.shape[0]

        def first(carry, blk):
            mx, s0, s1, s2, top = carry
            keys, idx = blk
            if distance:  # −β|x − y|²/2 from the differences themselves
                l = -0.5 * beta * jnp.sum((xq[:, None, :] - keys[None, :, :]) ** 2, axis=-1)
            else:
                l = jnp.matmul(q, keys.T, precision=HIGHEST)
            l = jnp.where(idx[None, :] < m, l, -jnp.inf)
            bmx = jnp.max(l, axis=1)
            new = jnp.maximum(mx, bmx)
            safe = jnp.where(jnp.isfinite(new), new, 0.0)
            a = jnp.exp(mx - safe)                    # the old sums' rescaling (0 at −inf)
            e = jnp.exp(l - safe[:, None])
            el = jnp.where(e > 0, e * (l - safe[:, None]), 0.0)
            s1 = jnp.where(a > 0, a * (s1 + (mx - safe) * s0), 0.0) + jnp.sum(el, axis=1)
            s0 = a * s0 + jnp.sum(e, axis=1)
            s2 = a * a * s2 + jnp.sum(e * e, axis=1)
            btop = idx[jnp.argmax(l, axis=1)]
            top = jnp.where(bmx > mx, btop, top)
            return (new, s0, s1, s2, top), None

        init = (jnp.full((nb,), -jnp.inf, q.dtype), jnp.zeros((nb,), q.dtype),
                jnp.zeros((nb,), q.dtype), jnp.zeros((nb,), q.dtype), jnp.zeros((nb,), jnp.int32))
        (_, s0, s1, s2, top), _ = jax.lax.scan(first, init, blocks)

        # |x − y|² − |x|² = |y|² − 2 x·y (the top key itself never counts)
        def dist(keys):
            return (jnp.sum(keys * keys, axis=-1)[None, :]
                    - 2.0 * jnp.matmul(xq, keys.T, precision=HIGHEST))

        yt = y[top]
        far = jnp.sum(yt * yt, axis=-1) - 2.0 * jnp.sum(xq * yt, axis=-1)

        def second(count, blk):
            keys, idx = blk
            nearer = ((dist(keys) < far[:, None]) & (idx[None, :] < m)
                      & (idx[None, :] != top[:, None]))
            return count + jnp.sum(nearer, axis=1, dtype=jnp.int32), None

        rank, _ = jax.lax.scan(second, jnp.zeros((nb,), jnp.int32), blocks)
        return WeightStats(1.0 / s0, jnp.log(s0) - s1 / s0, s0 * s0 / s2, top, rank)

    return map_query_blocks(rows, q_block, x, q_all)
