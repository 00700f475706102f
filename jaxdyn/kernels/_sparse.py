r"""The block-sparse core of squared-distance scores: ball bounds and the listed log-sum-exp.

Both block-sparse kernels score a row point x_i against a key y_j as a key potential minus a
squared distance, ``s_ij = p_j − |x_i − y_j|²``, times a row scale:

- the local attention kernel (:mod:`._local`): ``q_i · k_j = (|q_i| / 2)(|k_j|² − |q̂_i − k_j|²
  + |q̂_i|²)``, the score of the direction ``x_i = q̂_i`` against ``y_j = k_j`` with
  ``p_j = |k_j|²``, scaled by ``|q_i| / 2``;
- the multiscale W2 solver (:mod:`jaxdyn.distances._multiscale`): the Sinkhorn c-transform's
  ``(g_j − |x_i − y_j|²) / ε``, with ``p_j = g_j``, scaled by ``1 / ε``.

Over a ball of rows (centre c_I, radius r_I) and a ball of keys (c_J, ρ_J), every distance
lies between ``(|c_I − c_J| − r_I − ρ_J)₊`` and ``|c_I − c_J| + r_I + ρ_J``
(:func:`ball_distances`): the bounds of a block that both kernels' pruning starts from (the
attention kernel's quadratic bound; the W2 solver's ball-against-ball margins). Blocks are
kept in fixed-capacity lists (:func:`._blocks.pack_lists`, :func:`._blocks.block_lists`), and
:func:`listed_lse` is the log-sum-exp over a row leaf's listed key blocks only, with, on
request, each listed block's largest score against a lower bound of the row's log-sum-exp
(the exact margin that certifies a list). Its scores are formed by coordinate differences,
never as dot products: a dot-product score loses ``|x|² 2⁻²⁴ / ε`` to cancellation in
float32, more than Sinkhorn's tolerance at ε ~ 1e-5 (the attention kernel centres its keys on
a leaf centre for the same reason).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ._blocks import by_length, unsort
from ._lse import _times_inv, lse_tile
from ._online import pad_rows, running_update

__all__ = ["ball_distances", "listed_lse"]


def ball_distances(ca, ra, cb, rb):
    """The least and largest distance between a point of ball a and a point of ball b.

    Broadcasts: ``ca`` (..., d) against ``cb`` (..., d), the radii against their centres'
    leading shapes. The centres' distance by differences (no ``|a|² + |b|² − 2 a·b``
    cancellation).

    Args:
      ca: centres of the first balls.
      ra: their radii.
      cb: centres of the second balls.
      rb: their radii.

    Returns:
      ``(near, far)``: ``(|ca − cb| − ra − rb)₊`` and ``|ca − cb| + ra + rb``.
    """
    dist = jnp.sqrt(jnp.sum((ca - cb) ** 2, axis=-1))
    reach = ra + rb
    return jnp.maximum(dist - reach, 0.0), dist + reach


def _step(k: int) -> int:
    """Key blocks gathered per step of :func:`listed_lse` (a list length K a multiple of it)."""
    return 8 if k % 8 == 0 else 4 if k % 4 == 0 else 1


@functools.partial(jax.jit, static_argnames=("block", "batch"))
def listed_lse(rows, keys, pot, eps, lists, low=None, *, block: int, batch: int | None = None):
    r"""``eps · log Σ_{j in listed blocks} exp((pot_j − |rows_i − keys_j|²) / eps)`` for every row.

    ``rows`` (n, d) and ``keys`` (m, d) are cut into leaves of ``block`` points (the rows'
    last leaf padded); ``lists`` (nq, K) lists, for each row leaf, the key blocks to visit
    first (indices in ``[0, nk]``, ``nk`` an empty block that contributes nothing: the padding
    of a list, after its entries). An online log-sum-exp over a leaf's own entries only: the
    leaves are taken in the order of their list lengths (:func:`._blocks.by_length`) in
    batches of ``batch`` leaves, each batch one loop to its longest list, 8 (or 4) key blocks
    gathered a step (tiles of ``block`` × 8 ``block``: wider tiles keep the vector units busy;
    by length, so that a batch's lists are alike and its loop runs few padding steps).

    With ``low`` (n,) (a lower bound of each row's log-sum-exp; +inf on rows to leave out),
    also each listed block's exact margin ``max_{i in I, j in J} (pot_j − |x_i − y_j|² −
    low'_i)``, ``low'_i`` the larger of ``low_i`` and the row's log-sum-exp over its whole
    list (formed in the same pass): ``-inf`` on the padding of the lists.

    Args:
      rows: (n, d) row points, leaf by leaf.
      keys: (m, d) key points, leaf by leaf (m a multiple of ``block``).
      pot: (m,) the keys' potentials (``-inf`` on padding keys).
      eps: the temperature ε.
      lists: (nq, K) int32 key blocks per row leaf, padded with ``nk``.
      low: None, or (n,) lower bounds of the rows' log-sum-exps (the margins asked for).
      block: points per leaf.
      batch: row leaves a loop (the last batch completed with empty lists). None: ``512 // block``
        without ``low`` (more leaves a loop amortise its overhead), 8 with it (the loop then
        carries each leaf's (block, K) maxima).

    Returns:
      The row log-sum-exps (n,) (``-inf`` for a row whose listed terms are all ``-inf``);
      with ``low``, also the margins (nq, K).
    """
    n, d = rows.shape
    dtype = rows.dtype
    q, nq = pad_rows(rows, block)
    q = q.reshape(nq, block, d)
    kb = jnp.concatenate([keys.reshape(-1, block, d), jnp.zeros((1, block, d), dtype)])
    pb = jnp.concatenate([pot.astype(dtype).reshape(-1, block),
                          jnp.full((1, block), -jnp.inf, dtype)])
    nk = kb.shape[0] - 1
    kc = lists.shape[1]
    step = _step(kc)
    inv = jnp.asarray(1.0 / eps, dtype)
    track = low is not None

    def body(t, carry, xs, idx):  # one row leaf: (block, d), (K,)
        js = jax.lax.dynamic_slice(idx, (t * step,), (step,))
        ks, ps = kb[js].reshape(step * block, d), pb[js].reshape(step * block)
        if not track:
            return lse_tile(xs, ks, ps, inv, carry)
        mx, s, best = carry
        cost = (xs[:, None, 0] - ks[None, :, 0]) ** 2  # by coordinates, as lse_tile
        for c in range(1, d):
            cost = cost + (xs[:, None, c] - ks[None, :, c]) ** 2
        sc = ps[None, :] - cost                        # (block, step · block)
        best = jax.lax.dynamic_update_slice(
            best, jnp.max(sc.reshape(block, step, block), axis=2), (0, t * step))
        mx, s = running_update(mx, s, _times_inv(sc, inv), lambda w: jnp.sum(w, axis=1))
        return mx, s, best

    def leaves(args):
        # a batch of leaves, one loop to the batch's longest list (a leaf past its own list
        # visits the empty block: no term)
        xs, idx = args[:2]
        g = xs.shape[0]
        init = (jnp.full((g, block), -jnp.inf, dtype), jnp.zeros((g, block), dtype))
        if track:
            init += (jnp.full((g, block, kc), -jnp.inf, dtype),)
        steps = jnp.max((jnp.sum(idx < nk, axis=1) + step - 1) // step)
        out = jax.lax.fori_loop(
            0, steps, lambda t, c: jax.vmap(body, in_axes=(None, 0, 0, 0))(t, c, xs, idx), init)
        lse = eps * (out[0] + jnp.log(out[1]))
        if not track:
            return lse
        low_i = jnp.maximum(args[2], lse)
        return lse, jnp.max(out[2] - low_i[..., None], axis=1)

    order = by_length(jnp.sum(lists < nk, axis=1), step)  # batches of lists of one length
    g = min(nq, batch or (8 if track else max(1, 512 // block)))
    parts = [(q[order], 0.0), (lists[order], nk)]
    if track:
        low = pad_rows(low.astype(dtype), block, value=jnp.inf)[0].reshape(nq, block)
        parts.append((low[order], jnp.inf))
    # whole batches: leaves with empty lists appended (no step of their own)
    nb = -(-nq // g) * g
    parts = [pad_rows(a, g, value=v)[0].reshape((nb // g, g) + a.shape[1:]) for a, v in parts]
    out = jax.lax.map(leaves, tuple(parts))
    if not track:
        return unsort(out.reshape(nb, block)[:nq], order).reshape(-1)[:n]
    lse, marg = out
    return (unsort(lse.reshape(nb, block)[:nq], order).reshape(-1)[:n],
            unsort(marg.reshape(nb, kc)[:nq], order))
