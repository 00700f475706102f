r"""Multiscale, block-sparse Sinkhorn for large clouds in low dimension.

At the small ε that W2 of concentrated clouds needs (ε ≈ 0.005 · W2^2, e.g. 5e-6), the
Sinkhorn kernel ``exp((g_j - |x_i - y_j|^2) / ε)`` of a point x_i is negligible outside a
small neighbourhood of its image: almost every one of the N x M terms of a dense pass
is ``exp(-thousands)``. This module skips them *with a certificate*:

1. **Blocks, lists and kernel from the shared block-sparse core** (:mod:`jaxdyn.kernels`).
   Each cloud is cut into the leaves of the k-d tree of
   :func:`jaxdyn.kernels._blocks.kd_order` (median splits on whole leaves, cut apart at
   wide gaps; inside a leaf, runs of ``SUB`` and ``MID`` rows compact too), each padded to
   ``block`` points, with the balls of :func:`jaxdyn.kernels._blocks.balls` (centre c,
   radius r, grown by the bounds' rounding room). The lists of kept blocks are the core's
   fixed-capacity lists (:func:`jaxdyn.kernels._blocks.pack_lists`, the local attention
   kernel's too; :func:`jaxdyn.kernels._blocks.block_lists`: best first where the order
   matters, padded with an empty block; the capacity the longest list, bucketed by
   :func:`jaxdyn.kernels._blocks.list_length`), packed inside the program that takes them
   (:func:`jaxdyn.kernels._blocks.on_lists`). The bounds of a block start from the core's
   :func:`jaxdyn.kernels._sparse.ball_distances` (the attention kernel's quadratic bound
   too), and every pass over the lists is the core's
   :func:`jaxdyn.kernels._sparse.listed_lse`: the rounds' kernel, the c-transforms, and the
   exact margins (level (c) below, the same pass with each listed block's largest term).
   What stays here is W2's own: the potentials' margins (item 2), the ε ladder (items 3-4)
   and the certificate (item 5).
2. **Selection, three levels.** Key block J is kept for leaf I iff its margin, an upper
   bound of ``max_{i in I, j in J} (g_j - C_ij - R_i) / ε`` (R_i the row's log-sum-exp
   ``ε log Σ_j exp((g_j - C_ij)/ε)``), is ``>= -T`` with ``T = log M + 18``: the dropped
   terms then weigh less than ``1.5e-8`` of every row's sum. Each level works on the
   blocks that the one before cannot drop: (a) balls against balls
   (:func:`_block_margins`, O(nq · nk) on the device); (b) the leaf's ball against each key,
   tilted by the displacement v of its centre (to the centre's image, a Gibbs mean):
   every row x = c + δ obeys ``g_j - |x - y_j|^2 - h(x) <= u_IJ = max_{j in J} (g_j -
   |y_j - c|^2 + 2 r |y_j - c - v|)``, ``h(x) = 2 <δ, v> - |δ|^2``, against the exact
   log-sum-exp over the 16 best blocks, a lower bound of R_i
   (:func:`_leaf_margins_on`); (c) the exact margin, ``max (g_j - C_ij - low_i)``, low_i
   the row's log-sum-exp over its whole list, formed in the same pass
   (:func:`_exact_margins`). The bounds are loose in the sparse tails of a cloud, whose
   leaves are wide, and jump with the tilt: only the exact level makes a selection from
   a round's starting potentials hold for its final ones. Not the attention kernel's
   selection: its bounds are linear in the augmented keys ``(y_j, g_j - |y_j|^2)`` (the
   logit ``q_i · k_j`` with ``q_i = (2 x_i, 1) / ε``) and pay ``|q_i| r_J``, ~ 2 |x| r / ε,
   where the tilted bound pays 2 r |y_j - c - v| / ε, small near the image.
3. **Sparse kernel.** The core's :func:`jaxdyn.kernels._sparse.listed_lse`, the online
   log-sum-exp of ``blocked_lse`` over each leaf's kept blocks only (lists padded with an
   empty block to a common length K, a leaf batch looping to its own longest list; the
   leaves batched in the order of their list lengths). Not the attention kernel's tile
   pass: its terms are formed by differences (a dot-product logit loses ``|x|^2 2^-24 / ε``
   to cancellation in float32, more than Sinkhorn's tolerance at ε ~ 1e-5), it returns the
   log-sum-exp itself, and it gathers 8 key blocks a step.
4. **Coarse to fine.** The large-ε part of the ε ladder, where the kernel is wide and a
   sparse pass would be dense, is solved on the weighted centroids of the sub-blocks
   (N / 32 points) down to ε = 4 x their median squared radius; the potentials are carried
   to the points by one c-transform against the centroids, then the ladder continues on
   the points with sparse kernels, ε falling at most 4x per round on the points and 16x
   on the intermediate level. Each round starts at its own ε from the potentials of the
   two rounds before it (the first: the last two coarse ones, carried) extrapolated
   linearly in ε. On the intermediate
   level, the ladder below the coarse floor first runs to its end on the
   weighted centroids of runs of ``MID`` = 4 rows (N / 4 points or more, sparse rounds as on the
   points, no certificate: it only warm-starts, so its lists drop terms below e^-6 of a
   row's sum rather than 1.5e-8, and the lists of its first round, selected from the
   coarse solution carried, are checked after a short first attempt and completed if
   they lack needed blocks; a run whose points lie farther than
   ``sqrt(MID_SPREAD · ε)`` from their centroid, ε the predicted final one, enters as two
   halves or as its points), and the points start from its last
   solution carried to them, at its ε (block-sparse c-transforms, lists from levels (a)
   and (b) at margin T): the coarse-to-fine error is corrected on N / 4
   points, the points' rounds only correct the intermediate-to-fine one. The (x, y)
   over-relaxation of the sparse rounds is re-estimated at every error check
   (:func:`jaxdyn.distances._rounds._reestimating_solver`).
5. **Certificate.** A round's lists are selected from its starting potentials at its own ε
   (margin T + 4); the last round's are checked again with its final potentials (margin T),
   and the round is rerun from them with the union of both selections if a needed block
   was missing. The check first bounds the final margins by the selection's plus the
   potentials' move (:func:`_moved_margins`: a term moves by at most the largest move of
   its key block's potentials, a row's log-sum-exp by at least the least move over its
   list, or, for the (x, y) kernels, by its own move over its list, two passes over the
   lists: :func:`_moved_margins_by_rows`); only the leaves this cannot certify get their
   margins computed again at the final potentials (all leaves if more than a quarter). The final potentials are therefore a fixed point of a kernel that differs
   from the dense one by less than the bound above (``SinkhornW2.result`` is
   ``not_converged`` if the check still fails).

Used by :func:`jaxdyn.w2_sinkhorn` (``multiscale="auto"``: on for more than 2^24 cost
entries in dimension <= 6).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..kernels._lse import _blocked_lse as blocked_lse  # (clouds checked by the solver)
from ..kernels._blocks import (balls, by_length, kd_order, kd_size, list_density, list_length,
                               neighbours, on_lists, pow2_bucket, scatter_lists, unsort)
from ..kernels._sparse import ball_distances, listed_lse
from ._geometries import BLOCK
from ._rounds import _debiased_round, _ladder

#: the truncation margin is T = log(M) + _MARGIN_EXTRA: dropped terms weigh < M e^{-T} = 1.5e-8.
_MARGIN_EXTRA = 18.0
#: the intermediate level's margin is log(M / MID) + MID_MARGIN_EXTRA: it only warm-starts
#: the points (no certificate), and the terms its lists drop weigh < e^-6 of a row's sum.
#: Its lists are about a quarter lighter than at the certificate's margin, and the points'
#: round that follows is the same (iterations and S_ε; docs/math.md §D.4, item 11).
MID_MARGIN_EXTRA = 6.0


# --------------------------------------------------------------------------------------
# leaves: the shared k-d tree and balls
# --------------------------------------------------------------------------------------


#: rows per sub-block of a leaf: the selection bounds are made per sub-block (a smaller
#: radius, a tighter bound), the kernel tiles per leaf.
SUB = 32
#: rows per group of the intermediate level (its points are the groups' weighted centroids).
MID = 4


class Blocks(NamedTuple):
    """A cloud as padded k-d leaves (device arrays but ``counts``)."""

    pts: jax.Array  # (nb * block, d) leaf by leaf; padding at its leaf's centre
    valid: jax.Array  # (nb * block,) bool
    centers: jax.Array  # (nb, d): mean of the leaf's points
    radii: jax.Array  # (nb,): largest distance to the centre (enlarged by a relative 1e-6)
    sub_centers: jax.Array  # (nb * block / SUB, d): the same for sub-blocks of SUB rows
    sub_radii: jax.Array  # (nb * block / SUB,)
    counts: np.ndarray  # (nb,) points per leaf (host)


def kd_leaves(pts, block: int = BLOCK, dtype=None) -> np.ndarray:
    """The leaves of the shared k-d tree (:func:`jaxdyn.kernels._blocks.kd_order`) over ``pts``.

    Leaves of at most ``block`` points, cut apart at wide gaps (separated clusters never share
    a leaf: a leaf straddling two clusters would have a radius of the clusters' distance, and
    its rows would need every block); inside a leaf, runs of ``SUB`` rows and inside them runs
    of ``MID`` rows are compact too (median splits on whole runs).

    Returns:
        The leaves' indices into ``pts``, (nb, block), -1 for padding.
    """
    pts = np.asarray(pts)
    n, d = pts.shape
    # padded to a few lengths an octave: clouds of nearby sizes share one program
    padded = np.zeros((kd_size(n), d), pts.dtype if dtype is None else dtype)
    padded[:n] = pts
    order = kd_order(jnp.asarray(padded), n, units=(block, SUB, MID))
    perm, leaf, rank = (np.asarray(a) for a in order[:3])
    idx = np.full((int(order.n_leaves), block), -1, dtype=np.int64)
    ok = leaf >= 0
    idx[leaf[ok], rank[ok]] = perm[ok]
    return idx


@jax.jit
def _leaf_balls(pts, idx, valid, scale):
    """The leaves ``pts[idx]`` (nb, block, d) with their balls and those of their runs of SUB rows.

    Each radius grown by a relative 1e-6 and by 1e-6 of the cloud's largest coordinate
    ``scale``: room for the rounding of the centres and of the costs in the bounds.

    Returns:
        (the leaves' points, the padding at its leaf's centre; leaf balls; sub-block balls).
    """
    p = pts[idx]
    d = p.shape[-1]

    def grown(b):
        return b.centre, b.radius * (1 + 1e-6) + 1e-6 * scale

    leaf = grown(balls(p, valid))
    p = jnp.where(valid[..., None], p, leaf[0][:, None, :])
    sub = grown(balls(p.reshape(-1, SUB, d), valid.reshape(-1, SUB)))
    return p, leaf, sub


def make_blocks(pts, dtype, block=BLOCK, return_index=False) -> Blocks:
    """Padded k-d leaves of ``pts`` (:func:`kd_leaves`) with their balls (:func:`jaxdyn.kernels._blocks.balls`).

    Within a leaf the points are in median-split order, so runs of ``SUB`` rows are compact
    too (and, inside them, runs of ``MID`` rows: the groups of the intermediate level).

    Returns:
        :class:`Blocks`; with ``return_index``, also the (nb, block) indices into ``pts``
        (-1 for padding).
    """
    pts = np.asarray(pts)
    idx = kd_leaves(pts, block, dtype)
    valid = idx >= 0
    nb, d = idx.shape[0], pts.shape[1]
    scale = float(np.abs(pts).max()) if pts.size else 1.0
    p, (centers, radii), (sc, sr) = _leaf_balls(
        jnp.asarray(pts, dtype), jnp.asarray(np.where(valid, idx, 0)), jnp.asarray(valid),
        jnp.asarray(scale, dtype))
    out = Blocks(p.reshape(nb * block, d), jnp.asarray(valid.reshape(-1)), centers, radii, sc, sr,
                 valid.sum(1))
    return (out, idx) if return_index else out


# --------------------------------------------------------------------------------------
# block selection with its certificate
# --------------------------------------------------------------------------------------


def _image(w, keys, eps):
    """The mean of ``keys`` under the Gibbs weights ``softmax(w / eps)`` (``w`` may hold -inf).

    The image of a point whose scores against the keys are ``w``. The hard ``argmax`` would
    do for a valid bound, but it jumps between nearly tied keys when the potentials move by
    a fraction of ε, and a tilt towards the wrong one loosens the bound by hundreds of ε (the
    end-of-round check then asks for blocks that the selection had ruled out); the Gibbs
    mean moves continuously with the potentials.

    Returns:
        The mean key (d,).
    """
    p = jnp.exp((w - jnp.max(w)) / eps)
    return (p @ keys) / jnp.sum(p)


def _row_tilt(rows_pts, sc, v):
    """h(x_i) = 2 <δ_i, v_s> - |δ_i|^2, δ_i = x_i - c_s, for every row of every sub-block."""
    ns, d = sc.shape
    delta = rows_pts.reshape(ns, -1, d) - sc[:, None, :]
    return (2.0 * jnp.sum(delta * v[:, None, :], -1) - jnp.sum(delta ** 2, -1)).reshape(-1)


@jax.jit
def _ball_margins(centers, radii, key_centers, key_radii, pot, eps):
    """:func:`_block_margins` on the device, in the points' dtype."""
    nk = key_centers.shape[0]
    p = pot.astype(centers.dtype).reshape(nk, -1)
    fin = jnp.isfinite(p)
    p_hi = jnp.max(jnp.where(fin, p, -jnp.inf), axis=1)
    p_lo = jnp.min(jnp.where(fin, p, jnp.inf), axis=1)
    p_lo = jnp.where(jnp.isfinite(p_lo), p_lo, -jnp.inf)
    near, far = ball_distances(centers[:, None, :], radii[:, None], key_centers[None, :, :],
                               key_radii[None, :])
    hi = p_hi[None, :] - near * near
    lo = jnp.max(p_lo[None, :] - far * far, axis=1)
    # rounding: a few ulps of the potentials, the squared distances and the row's bound
    # (its own squared distance is at most max |p| - lo)
    big = jnp.max(jnp.where(fin, jnp.abs(p), 0.0))
    slack = 16.0 * jnp.finfo(centers.dtype).eps * (big + near * near + jnp.abs(lo)[:, None])
    return (hi - lo[:, None] + slack) / eps


def _block_margins(rows: Blocks, keys: Blocks, pot, eps) -> np.ndarray:
    """Block-level upper bounds of ``(term_ij - R_i) / eps`` (level (a) of the selection).

    For leaf I (centre c_I, radius r_I) against key block J (centre y_J, radius ρ_J,
    potentials in [P⁻_J, P⁺_J]), with the core's ball distances
    (:func:`jaxdyn.kernels._sparse.ball_distances`): every term obeys ``pot_j - |x_i - y_j|^2
    <= P⁺_J - (|c_I - y_J| - r_I - ρ_J)_+^2``, and every row's log-sum-exp is at least its
    largest term, ``R_i >= max_J (P⁻_J - (|c_I - y_J| + r_I + ρ_J)^2)``. Loose (by the
    variation of the potential and of the distance across two blocks), O(nq · nk) on the
    device: it only spares the tilted bounds of :func:`_leaf_margins_on` the blocks that are
    far from a leaf's image.

    Returns:
        The bounds (nq, nk), float64 on the host.
    """
    dtype = rows.centers.dtype
    return np.asarray(_ball_margins(rows.centers, rows.radii, keys.centers, keys.radii,
                                    jnp.asarray(pot, dtype), jnp.asarray(eps, dtype)), np.float64)


@functools.partial(jax.jit, static_argnames=("nb", "block"))
def _take_leaves(b: Blocks, idx, *, nb, block):
    """The leaves ``idx`` of ``b`` (device arrays), then empty leaves up to ``nb``, as one program.

    Returns:
        The device arrays of :class:`Blocks` (``counts`` None).
    """
    nb0 = b.centers.shape[0]

    def take(a):
        per = a.shape[0] // nb0
        a = a.reshape((nb0, per) + a.shape[1:])[idx]
        a = jnp.concatenate([a, jnp.zeros((nb - idx.shape[0],) + a.shape[1:], a.dtype)])
        return a.reshape((nb * per,) + a.shape[2:])

    return Blocks(*(take(a) for a in b[:-1]), None)


def _pad_leaves(b: Blocks, nb: int, block: int, idx=None) -> Blocks:
    """``b`` (or its leaves ``idx``) with empty leaves appended up to ``nb`` leaves (no valid point, centre and radius 0).

    Two clouds at one leaf count share the programs of the rounds and of the selection (an
    empty leaf's rows have weight 0, its keys potential -inf, its lists no block).

    Returns:
        The padded :class:`Blocks`.
    """
    if idx is None:
        if nb <= b.centers.shape[0]:
            return b
        idx = np.arange(b.centers.shape[0])
    counts = np.concatenate([b.counts[idx], np.zeros(nb - len(idx), b.counts.dtype)])
    return _take_leaves(b._replace(counts=None), jnp.asarray(idx), nb=nb, block=block)._replace(
        counts=counts)


def _common_leaves(nb1: int, nb2: int) -> int:
    """The leaf count that two clouds are padded to (a multiple of 8)."""
    return -(-max(nb1, nb2) // 8) * 8


@functools.partial(jax.jit, static_argnames=("block", "n_low"))
def _leaf_margins_on(rows_pts, rows_valid, centers, radii, keys, pot, eps, cand, *, block,
                     n_low=16):
    """Tilted bounds of each leaf I against the key blocks J of its list ``cand``.

    Leaf I has centre c, radius r, rows x = c + δ; ``cand`` (nq, Kc) lists its blocks best
    first, padded with the empty block nk. With ``v = ȳ - c`` (ȳ the image of the centre,
    :func:`_image`, over the first 8 blocks) and ``h(x) = 2 <δ, v> - |δ|^2``,

        pot_j - |x - y_j|^2 - h(x) <= u_IJ = max_{j in J} (pot_j - |y_j - c|^2
                                              + 2 r |y_j - c - v|)

    (expand ``|x - y_j|^2`` about c; exact in the keys, a ball only on the rows: tilting by
    the displacement keeps the slack small near the image). ``low_i``, the exact
    log-sum-exp over the ``n_low`` blocks of best bound, is at most the row's R_i, so every
    term of a row of I against J lies below ``R_i + u_IJ - L_I``, ``L_I = min_i (low_i -
    h(x_i))``.

    Returns:
        ((u_IJ - L_I) / eps (nq, Kc), -inf on the padding; low (n,), +inf on padding rows).
    """
    n, d = rows_pts.shape
    nq, kc = cand.shape
    kb = jnp.concatenate([keys.reshape(-1, block, d), jnp.zeros((1, block, d), keys.dtype)])
    pb = jnp.concatenate([pot.reshape(-1, block), jnp.full((1, block), -jnp.inf, pot.dtype)])
    nk = kb.shape[0] - 1
    step = 8  # candidate blocks per step (kc is a multiple of 8)

    def leaf(args):
        c, r, idx = args  # (d,), (), (kc,)
        ks0 = kb[idx[:step]].reshape(step * block, d)
        w0 = pb[idx[:step]].reshape(step * block) - jnp.sum((ks0 - c) ** 2, axis=-1)
        v = _image(w0, ks0, eps) - c

        def body(t, u):
            js = jax.lax.dynamic_slice(idx, (t * step,), (step,))
            ks = kb[js].reshape(step * block, d)
            w = pb[js].reshape(step * block) - jnp.sum((ks - c) ** 2, axis=-1)
            e = jnp.sqrt(jnp.sum((ks - (c + v)) ** 2, axis=-1))
            ub = jnp.max((w + 2.0 * r * e).reshape(step, block), axis=1)
            return jax.lax.dynamic_update_slice(u, ub, (t * step,))

        steps = (jnp.sum(idx < nk) + step - 1) // step
        u = jax.lax.fori_loop(0, steps, body, jnp.full((kc,), -jnp.inf, kb.dtype))
        return u, v

    order = by_length(jnp.sum(cand < nk, axis=1), step)  # batches of lists of one length
    u, v = jax.lax.map(leaf, (centers[order], radii[order], cand[order]), batch_size=8)
    u, v = unsort(u, order), unsort(v, order)
    k_low = min(n_low, kc)
    _, top = jax.lax.top_k(u, k_low)
    low_nbr = jnp.take_along_axis(cand, top, axis=1)
    low_nbr = jnp.where(jnp.take_along_axis(u, top, axis=1) > -jnp.inf, low_nbr, nk)
    if k_low % 8:
        low_nbr = jnp.concatenate([low_nbr, jnp.full((nq, 8 - k_low % 8), nk, low_nbr.dtype)], 1)
    low = jnp.where(rows_valid, listed_lse(rows_pts, keys, pot, eps, low_nbr, block=block),
                    jnp.inf)
    low_leaf = jnp.min((low - _row_tilt(rows_pts, centers, v)).reshape(nq, block), axis=1)
    return (u - low_leaf[:, None]) / eps, low


def _exact_margins(rows_pts, rows_valid, low, keys, pot, eps, cand, *, block):
    """The exact margins of the listed blocks in units of ε (the core's :func:`jaxdyn.kernels._sparse.listed_lse`).

    ``max_{i in I, j in J} (pot_j - |x_i - y_j|^2 - low_i) / eps`` for each leaf I and each
    key block J of its list ``cand``, ``low_i`` the larger of ``low`` and the row's
    log-sum-exp over its whole list (formed in the same pass: a list that holds every block
    that the bounds could not drop holds the row's mass, so ``low_i`` is then R_i to the
    dropped terms' 1e-8). Tight where the ball bounds are loose (the sparse tails of a
    cloud, whose leaves are wide), and continuous in the potentials. About one Sinkhorn
    half-iteration over the same lists.

    Returns:
        The margins (nq, Kc), -inf on the padding of the lists.
    """
    low = jnp.where(rows_valid, low, jnp.inf)
    return listed_lse(rows_pts, keys, pot, eps, cand, low, block=block)[1] / eps


def leaf_margins(rows: Blocks, keys: Blocks, pot, eps, block: int = BLOCK,
                 candidate_margin: float = float("inf"), exact: bool = True):
    """Upper bounds of ``(term_ij - R_i) / eps`` over the rows i of leaf I and the keys j of block J.

    On the host, (nq, nk) (they also order the lists: largest first). Three levels, each on
    the blocks that the one before cannot drop at ``candidate_margin``: block-level balls
    (:func:`_block_margins`, O(nq · nk)), the tilted bound of the leaf against each key
    (:func:`_leaf_margins_on`), then the exact margin (:func:`_exact_margins`;
    ``exact=False``: without it); a block keeps the smallest of its valid bounds.

    Returns:
        The bounds (nq, nk), float64.
    """
    eps_a = jnp.asarray(eps, rows.pts.dtype)
    m = _block_margins(rows, keys, pot, eps)
    nk = m.shape[1]
    pre = m >= -candidate_margin
    # the 8 best blocks first: the tilt is taken towards the image over them
    cand, (m_leaf, low) = on_lists(
        _leaf_margins_on, (rows.pts, rows.valid, rows.centers, rows.radii, keys.pts, pot, eps_a),
        jnp.asarray(pre), jnp.asarray(m), cap=list_length(pre, pow2=True), block=block, best=8)
    m = np.where(pre, np.minimum(m, scatter_lists(np.asarray(cand), np.asarray(m_leaf, np.float64), nk)),
                 m)
    if not exact:
        return m
    keep = m >= -candidate_margin
    cand, m_ex = on_lists(_exact_margins, (rows.pts, rows.valid, low, keys.pts, pot, eps_a),
                           jnp.asarray(keep), cap=list_length(keep, pow2=True), block=block)
    return np.where(keep, np.minimum(m, scatter_lists(np.asarray(cand), np.asarray(m_ex, np.float64), nk)),
                    m)


def select(rows: Blocks, keys: Blocks, pot, eps, margin: float, block: int = BLOCK):
    """Certified selection for the update of ``rows`` against ``keys`` with potential ``pot`` at ``eps``.

    Key block J is kept for leaf I iff its margin (:func:`leaf_margins`) is at least
    ``-margin``.

    Returns:
        (keep (nq, nk) bool, the margins (nq, nk)) on the host.
    """
    m = leaf_margins(rows, keys, pot, eps, block, candidate_margin=margin)
    return m >= -margin, m


@jax.jit
def c_transform_from_coarse(pts, centers, coarse_pot, eps, log_w):
    """Fine potential ``ε log w - ε lse_J((coarse_pot_J - |p - c_J|^2)/ε)``: a centroid solution carried to the points.

    (ott's convention f_i = ε log a_i - app_lse.)

    Returns:
        The potentials on ``pts``.
    """
    return eps * log_w - blocked_lse(pts, centers, coarse_pot, eps)


# --------------------------------------------------------------------------------------
# the solver: coarse ladder on centroids, then certified sparse rounds on the points
# --------------------------------------------------------------------------------------

#: the largest ε ratio between two rounds on the points: a round's selection is made at
#: its largest ε, so a small ratio keeps the selections tight.
FINE_ROUND_RATIO = 4.0
#: the centroid ladder stops at COARSE_FLOOR x the median squared sub-block radius, where the
#: centroids stop resolving the kernel.
COARSE_FLOOR = 4.0
#: reruns of a round whose final check finds a needed block missing.
_MAX_RESELECT = 3
#: iterations of one attempt of a round on the intermediate level; a round not converged by
#: then selects again from the potentials it reached and goes on if they need blocks its
#: lists lack (within max_iterations in all); if its lists cover them, it goes on with the
#: same lists up to ATTEMPT_LIMIT iterations in all, then hands its potentials on as they
#: are: lists that carry no plan never converge, and short attempts find them early
#: (docs/math.md §D.4, item 10).
ATTEMPT_ITERATIONS = 150
ATTEMPT_LIMIT = 600
#: iterations of the first attempt of the intermediate level's first round, whose lists are
#: selected from the coarse solution carried (the farthest start of the ladder): its lists
#: are checked that early: every iteration spent on lists that miss needed blocks is lost,
#: and where the lists were enough the early check costs one reselection (docs/math.md
#: §D.4, item 11).
FIRST_ATTEMPT = 40
#: the lists of a round are selected with the margin enlarged by this many ε (the
#: potentials move during the round; the final check uses the certificate's margin).
_SELECT_EXTRA = 4.0
#: the iteration at which the over-relaxation is first measured in the rounds on the points
#: (they start by extrapolation at their own ε: no annealing to wait for; then it is
#: re-estimated at every error check, every ``_rounds.XY_INNER`` iterations). Measuring it
#: early, from the second check on, takes fewer iterations than waiting for an annealing
#: over FINE_ROUND_RATIO, in the intermediate rounds and in the points' round alike
#: (docs/math.md §D.4, items 9 and 11).
FINE_MOMENTUM_START = 10


def _same(p, q) -> bool:
    """Bitwise-equal potentials (``-inf`` padding included)."""
    return p is q or bool(np.array_equal(np.asarray(p), np.asarray(q)))


def _sym_margins(rows: Blocks, p1, p2, eps, block, t, keys: Blocks | None = None):
    """The margins of a symmetric problem's kernel (rows against themselves) for both its potentials.

    ``p1``, ``p2`` are equal but for rounding (symmetric start, parallel updates): then, with
    ``δ = max |p1 - p2|``, the margins of ``p2`` are at most those of ``p1`` plus ``2 δ / ε``
    (a key's term moves by at most δ, a row's log-sum-exp too), one computation instead of
    two; if they differ by more than ε / 2, both are computed.

    ``keys``: the cloud's leaves when ``rows`` are some of them (default: ``rows``).

    Returns:
        The margins (nq, nk) valid for both potentials.
    """
    keys = rows if keys is None else keys
    m = leaf_margins(rows, keys, p1, eps, block, t)
    if _same(p1, p2):
        return m
    a, b = np.asarray(p1, np.float64), np.asarray(p2, np.float64)
    fin = np.isfinite(a)
    if np.array_equal(fin, np.isfinite(b)):
        delta = float(np.max(np.abs(a[fin] - b[fin]), initial=0.0))
        if delta <= 0.5 * float(eps):
            return m + 2.0 * delta / float(eps)
    return np.maximum(m, leaf_margins(rows, keys, p2, eps, block, t))


def _leaf_subset(b: Blocks, leaves: np.ndarray, block: int) -> Blocks:
    """The leaves ``leaves`` of ``b``, with empty leaves appended up to a :func:`pow2_bucket` count.

    (A few counts: the selection's programs are compiled a few times only.)

    Returns:
        The :class:`Blocks` of those leaves.
    """
    return _pad_leaves(b, pow2_bucket(len(leaves)), block, np.asarray(leaves))


def _moved_margins(m, keep, p0, p1, eps):
    """Upper bounds of the margins at key potentials ``p1`` from bounds ``m`` at ``p0``.

    ``m`` (nq, nk) bounds ``(p0_j - C_ij - R_i) / ε`` over the rows of leaf I and the keys of
    block J (R_i the row's log-sum-exp at ``p0``), ``keep`` the lists. With ``Δ = p1 - p0``,
    a term moves by at most ``max_{j in J} Δ_j``, and the row's log-sum-exp at ``p1`` is at
    least its sum over the listed blocks, which moves by at least ``min_{j in list(I)} Δ_j``
    and held all but a fraction ``η_I <= block Σ_{J dropped} e^{m_IJ}`` of R_i's mass
    (:func:`_dropped_share`), so

        margin at p1 <= m_IJ + (max_{j in J} Δ_j - min_{j in list(I)} Δ_j) / ε - log(1 - η_I)

    (a leaf with an empty list takes the minimum over every key). No kernel pass: the
    end-of-round check of a round whose potentials moved little since its selection.

    Returns:
        The bounds (nq, nk), or None if ``p0``, ``p1`` differ in which entries are finite.
    """
    a, b = np.asarray(p0, np.float64), np.asarray(p1, np.float64)
    fin = np.isfinite(a)
    if not np.array_equal(fin, np.isfinite(b)):
        return None
    nk = m.shape[1]
    d = (b - np.where(fin, a, 0.0)).reshape(nk, -1)
    fin = fin.reshape(nk, -1)
    d_max = np.max(np.where(fin, d, -np.inf), axis=1)
    d_min = np.min(np.where(fin, d, np.inf), axis=1)
    listed = np.min(np.where(keep, d_min[None, :], np.inf), axis=1)
    low = np.where(keep.any(1), listed, np.min(d_min, initial=np.inf))
    with np.errstate(invalid="ignore"):
        bound = (m + (d_max[None, :] - low[:, None]) / float(eps)
                 + _dropped_share(m, keep, a.size // nk)[:, None] + 1e-6)
    return np.where(np.isnan(bound), np.inf, bound)


def _dropped_share(m, keep, block):
    """``-log(1 - η_I)``, ``η_I = block Σ_{J not in keep} e^{m_IJ}`` (+inf if η_I >= 1).

    η_I bounds the share of a row's sum that the blocks dropped from leaf I's list hold
    (each of their ``block`` terms is at most ``e^{m_IJ}`` of it).

    Returns:
        (nq,) float64.
    """
    with np.errstate(over="ignore"):
        eta = block * np.sum(np.where(keep, 0.0, np.exp(np.minimum(m, 700.0))), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(eta < 1.0, -np.log1p(-np.where(eta < 1.0, eta, 0.0)), np.inf)


def _moved_margins_by_rows(m, keep, rows: Blocks, keys: Blocks, p0, p1, eps, block):
    """:func:`_moved_margins` with each row's own move of its log-sum-exp over its list.

    Where the potentials' move has a gradient, the move of a row's log-sum-exp is far
    above the least move over its list: this takes it exactly, ``R'^list_i - R^list_i``
    (two passes over the lists, at ``p0`` and at ``p1``), and the row's log-sum-exp at
    ``p0`` is at most ``R^list_i - ε log(1 - η_I)``, ``η_I = block Σ_{J dropped} e^{m_IJ}``
    the dropped fraction, so

        margin at p1 <= m_IJ + (max_{j in J} Δ_j - min_{i in I} (R'^list_i - R^list_i)) / ε
                        - log(1 - η_I).

    Returns:
        The bounds (nq, nk) (+inf where they cannot be formed).
    """
    nq, nk = m.shape
    dtype = rows.pts.dtype
    e, zero = jnp.asarray(eps, dtype), jnp.zeros((), dtype)
    r0, r1 = np.asarray(on_lists(  # -R^list (ε log w = 0) at p0, p1
        _sparse_c_transform, (rows.pts, rows.valid, keys.pts, (p0, p1), e, zero),
        jnp.asarray(keep), cap=list_length(keep, pow2=True), block=block)[1], np.float64)
    ok = np.isfinite(r0) & np.isfinite(r1)
    move = np.where(ok, np.where(ok, r0, 0.0) - np.where(ok, r1, 0.0), np.inf)
    move = np.min(move.reshape(nq, block), axis=1)
    bad_rows = (np.asarray(rows.valid) & ~ok).reshape(nq, block).any(1)
    low = np.where(bad_rows, -np.inf, move)
    a, b = np.asarray(p0, np.float64), np.asarray(p1, np.float64)
    if not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return np.full(m.shape, np.inf)
    fin = np.isfinite(a).reshape(nk, -1)
    d = (b - np.where(np.isfinite(a), a, 0.0)).reshape(nk, -1)
    d_max = np.max(np.where(fin & np.isfinite(d), d, -np.inf), axis=1)
    # float32 log-sum-exps: a slack of 1e-3 in units of ε
    with np.errstate(invalid="ignore"):
        bound = (m + (d_max[None, :] - low[:, None]) / float(eps)
                 + _dropped_share(m, keep, a.size // nk)[:, None] + 1e-3)
    return np.where(np.isnan(bound), np.inf, bound)


class _Selection:
    """Keep masks of the four kernels (xy rows x, xy rows y, xx, yy) and their lists."""

    def __init__(self, bx: Blocks, by: Blocks, block: int, margin: float):
        self.bx, self.by, self.block, self.margin = bx, by, block, margin
        self.keep = None
        self.order = None
        self.width = 0  # the longest list length so far: the level's rounds share one program
        self._last = None  # (pots, eps, {kernel: margins}): the check serves the next select
        self._base = None  # (pots, eps, margins) of the last update: the check's first try

    def _kernel_margins(self, pots, eps, k):
        """The margins of kernel ``k`` (0: xy rows x, 1: xy rows y, 2: xx, 3: yy) at ``pots``."""
        if not (self._last is not None and self._last[0] is pots and self._last[1] == eps):
            self._last = (pots, eps, {})
        done = self._last[2]
        if k not in done:
            (f, g), (fx, gx), (fy, gy) = pots
            bx, by, b = self.bx, self.by, self.block
            t = self.margin + max(_SELECT_EXTRA, 0.0)  # candidates for the widest use (select)
            done[k] = (leaf_margins(bx, by, g, eps, b, t) if k == 0 else
                       leaf_margins(by, bx, f, eps, b, t) if k == 1 else
                       _sym_margins(bx, fx, gx, eps, b, t) if k == 2 else
                       _sym_margins(by, fy, gy, eps, b, t))
        return done[k]

    def _margins(self, pots, eps):
        return [self._kernel_margins(pots, eps, k) for k in range(4)]

    def _leaf_margins_of(self, pots, eps, k, leaves):
        """The margins of kernel ``k`` at ``pots`` for the row leaves ``leaves`` only."""
        (f, g), (fx, gx), (fy, gy) = pots
        bx, by, b = self.bx, self.by, self.block
        t = self.margin + max(_SELECT_EXTRA, 0.0)
        rows = _leaf_subset((bx, by, bx, by)[k], leaves, b)
        m = (leaf_margins(rows, by, g, eps, b, t) if k == 0 else
             leaf_margins(rows, bx, f, eps, b, t) if k == 1 else
             _sym_margins(rows, fx, gx, eps, b, t, keys=bx) if k == 2 else
             _sym_margins(rows, fy, gy, eps, b, t, keys=by))
        return m[:len(leaves)]

    def update(self, pots, eps, fresh=True, extra=0.0):
        """Select at ``eps`` from ``pots`` with the margin enlarged by ``extra``.

        ``extra`` is in units of ε: room for the potentials to move during the round;
        ``fresh=False`` adds to the current selection.

        Returns:
            The four neighbour lists, at one length.
        """
        marg = self._margins(pots, eps)
        self._base = (pots, eps, marg)
        new = [m >= -(self.margin + extra) for m in marg]
        if fresh or self.keep is None:
            self.keep = new
        else:
            self.keep = [a | n for a, n in zip(self.keep, new)]
        self.order = marg  # the margins of the selection
        # the four lists at one length, never shorter than the level's lists so far: a
        # round's program is compiled per length, and a list's padding costs no kernel work
        # (a list in block order: the online log-sum-exp does not depend on it)
        self.width = max(self.width, pow2_bucket(max(int(k.sum(1).max(initial=0)) for k in self.keep)))
        return on_lists(None, (), tuple(jnp.asarray(k) for k in self.keep),
                         cap=list_length(self.keep[0], width=self.width))[0]

    def _moved_bounds(self, pots, eps, k):
        """Bounds of kernel ``k``'s margins from the last selection's and the potentials' move.

        :func:`_moved_margins` for each key potential of the kernel (both, for a symmetric
        one).

        Returns:
            The bounds (nq, nk), or None if they cannot be formed.
        """
        if self._base is None or self._base[1] != eps:
            return None
        (f0, g0), (fx0, gx0), (fy0, gy0) = self._base[0]
        (f1, g1), (fx1, gx1), (fy1, gy1) = pots
        pairs = [((g0, g1),), ((f0, f1),), ((fx0, fx1), (gx0, gx1)), ((fy0, fy1), (gy0, gy1))][k]
        keep, m = self.keep[k], self._base[2][k]
        out = None
        for p0, p1 in pairs:
            bound = _moved_margins(m, keep, p0, p1, eps)
            if bound is None:
                return None
            out = bound if out is None else np.maximum(out, bound)
        if k < 2:
            rows, keys = (self.bx, self.by) if k == 0 else (self.by, self.bx)
            out = np.minimum(out, _moved_margins_by_rows(m, keep, rows, keys, *pairs[0], eps,
                                                         self.block))
        return out

    def covers(self, pots, eps) -> bool:
        """Every block that the certificate at ``eps`` needs for ``pots`` is in the lists.

        Kernel by kernel: first from the margins of the last selection and the move of the
        potentials since (:func:`_moved_margins`, no kernel pass: it certifies the symmetric
        problems' kernels, whose potentials barely move in a round, and most leaves of the
        (x, y) ones); the leaves that this cannot certify get their margins at ``pots``
        (all leaves' if more than a quarter of them).

        Returns:
            Whether the lists hold every needed block.
        """
        marg, n_moved, again = [], 0, []
        for k in range(4):
            bound = self._moved_bounds(pots, eps, k)
            keep = self.keep[k]
            if bound is None:
                marg.append(self._kernel_margins(pots, eps, k))
                continue
            bad = np.flatnonzero((~keep & (bound >= -self.margin)).any(1))
            if bad.size > keep.shape[0] // 4:
                marg.append(self._kernel_margins(pots, eps, k))
                continue
            n_moved += 1
            again.append(int(bad.size))
            if bad.size:
                bound = bound.copy()
                bound[bad] = self._leaf_margins_of(pots, eps, k, bad)
            marg.append(bound)
        if os.environ.get("JAXDYN_W2_LOG"):
            _log(f"check: {n_moved} of 4 kernels certified by the selection's margins and the "
                 f"potentials' move, but for {again} leaves whose margins are computed again")
        ok = [bool(np.all(h | (m < -self.margin))) for h, m in zip(self.keep, marg)]
        if not all(ok) and os.environ.get("JAXDYN_W2_LOG"):
            for name, h, m, good in zip(("xy rows x", "xy rows y", "xx", "yy"), self.keep, marg, ok):
                if good:
                    continue
                miss = ~h & (m >= -self.margin)
                rows = np.flatnonzero(miss.any(1))
                _log(f"check: {name}: {int(miss.sum())} needed blocks missing in {rows.size} of "
                     f"{miss.shape[0]} leaves (largest bound {float(m[miss].max()):.2f}, margin "
                     f"{self.margin:.2f}); kept per leaf there {h[rows].sum(1).tolist()[:8]}")
        return all(ok)


@jax.jit
def _extrapolate_pots(p1, p2, t):
    def one(a1, a2):
        ok = jnp.isfinite(a1) & jnp.isfinite(a2)
        return jnp.where(ok, a2 + t * (a2 - jnp.where(ok, a1, 0.0)), a2)

    return jax.tree_util.tree_map(one, p1, p2)


def _log(msg: str) -> None:
    """One line on stderr when the environment sets ``JAXDYN_W2_LOG=1``.

    The profile of a run: ε, iterations, kernel density, CPU seconds of the process.
    """
    if os.environ.get("JAXDYN_W2_LOG"):
        print(f"[w2 multiscale {time.process_time():8.1f} cpu-s] {msg}", file=sys.stderr, flush=True)


def _centre_components(pots, nbr_x, nbr_y, wx, wy):
    """The (x, y) potentials with the gauge fixed per connected component of the kernel's block graph.

    x leaf I -- y leaf J when J is in I's list or I in J's. Within a component ``f + c,
    g - c`` is the same plan, and no listed term joins two components, so each has its own
    constant: the round centres only the total (``_round_body``), and a component whose
    constant drifted (two separated clusters after a round on lists that carried no plan)
    costs float32 ``|f| 2^-24 / ε`` of accuracy in every log-sum-exp, at small ε more than
    Sinkhorn's tolerance (docs/math.md §D.4, item 10).
    Each component gets ``c = (<a, f>_C / a(C) - <b, g>_C / b(C)) / 2``.

    Returns:
        ``pots`` with its (x, y) pair shifted per component.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    (f, g) = pots[0]
    nx, ny = nbr_x.shape[0], nbr_y.shape[0]
    ix = np.repeat(np.arange(nx), nbr_x.shape[1])
    jx = nbr_x.reshape(-1)
    iy = np.repeat(np.arange(ny), nbr_y.shape[1])
    jy = nbr_y.reshape(-1)
    okx, oky = jx < ny, jy < nx
    rows = np.concatenate([ix[okx], nx + iy[oky]])
    cols = np.concatenate([nx + jx[okx], jy[oky]])
    graph = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(nx + ny, nx + ny))
    n_comp, label = connected_components(graph, directed=False)
    if n_comp <= 1:
        return pots
    fv, gv = np.asarray(f, np.float64), np.asarray(g, np.float64)
    a, b = np.asarray(wx, np.float64), np.asarray(wy, np.float64)
    block = fv.shape[0] // nx
    lx, ly = np.repeat(label[:nx], block), np.repeat(label[nx:], block)
    okf, okg = (a > 0) & np.isfinite(fv), (b > 0) & np.isfinite(gv)
    sa = np.bincount(lx[okf], a[okf] * fv[okf], n_comp)
    ma = np.bincount(lx[okf], a[okf], n_comp)
    sb = np.bincount(ly[okg], b[okg] * gv[okg], n_comp)
    mb = np.bincount(ly[okg], b[okg], n_comp)
    c = 0.5 * (np.divide(sa, ma, out=np.zeros(n_comp), where=ma > 0)
               - np.divide(sb, mb, out=np.zeros(n_comp), where=mb > 0))
    c = np.where((ma > 0) & (mb > 0), c, 0.0)
    f = jnp.asarray(fv - c[lx], f.dtype)
    g = jnp.asarray(gv + c[ly], g.dtype)
    return ((f, g),) + tuple(pots[1:])


def _extrapolate(h1, h2, eps):
    """Potentials at ``eps`` linearly extrapolated from two rounds (ε1, p1), (ε2, p2)."""
    (e1, p1), (e2, p2) = h1, h2
    t = (eps - e2) / (e2 - e1)
    return _extrapolate_pots(p1, p2, jnp.asarray(t, p2[0][0].dtype))


#: points per k-d leaf of the rounds on the points (a multiple of SUB). Smaller leaves follow
#: the kernel's support more closely (a kept block costs all its block × block terms) but
#: make longer lists (more selection work, shorter kernel tiles); docs/math.md §D.4, items 8
#: and 11.
FINE_BLOCK = 32


#: the largest ε ratio between two rounds on the intermediate level (it only warm-starts:
#: no selection needs to stay tight): fewer, longer rounds, short of one round too far apart
#: to converge in its attempt (``benchmarks/bench_w2.py``, ``JAXDYN_W2_LOG=1``).
MID_ROUND_RATIO = 16.0
#: the rounds on the points start this fraction below the intermediate level's last ε.
MID_EPS_BELOW = 0.02
#: a round whose ε is at least this fraction of the previous round's keeps its lists.
REUSE_LISTS_ABOVE = 0.9


#: a group of MID rows becomes one point of the intermediate level only if its points lie
#: within sqrt(MID_SPREAD · ε) of their centroid, ε the ladder's predicted final ε; wider
#: groups (the clouds' sparse tails) enter as two halves, or as their points: the c-transform
#: carrying the intermediate solution is off by up to r^2 / ε at a point whose group has
#: radius r, and the points' first selection would miss needed blocks (docs/math.md §D.4,
#: item 10).
MID_SPREAD = 2.0


def _mid_cloud(b: Blocks, dtype, block, r2_max=float("inf")):
    """The intermediate level of a cloud in leaves ``b``: the weighted centroids of its runs of MID rows.

    The runs (compact: :func:`make_blocks` orders them so) become new leaves, with their
    weights (mass of the run, 0 on the padding) in leaf order. A run whose points lie
    farther than ``sqrt(r2_max)`` from its centroid is split in two along its widest
    coordinate, and a half still that wide into its points, so that every point of the
    cloud lies within ``sqrt(r2_max)`` of the intermediate point that stands for it (or is
    one itself).

    Returns:
        (the intermediate :class:`Blocks`, their weights in leaf order).
    """
    pts = np.asarray(b.pts, np.float64)
    valid = np.asarray(b.valid)
    d = pts.shape[1]
    total = valid.sum()
    g = pts.reshape(-1, MID, d)
    gv = valid.reshape(-1, MID)
    cnt = gv.sum(1)
    cen = (g * gv[..., None]).sum(1) / np.maximum(cnt, 1)[:, None]
    r2 = np.where(gv, ((g - cen[:, None, :]) ** 2).sum(-1), 0.0).max(1)
    whole = (cnt > 0) & (r2 <= r2_max)
    cens, ws = [cen[whole]], [cnt[whole]]
    for k in np.flatnonzero((cnt > 0) & ~whole):
        p = g[k][gv[k]]
        axis = int(np.argmax(p.max(0) - p.min(0)))
        p = p[np.argsort(p[:, axis], kind="stable")]
        for half in (p[: len(p) // 2], p[len(p) // 2:]):
            if not len(half):
                continue
            c = half.mean(0)
            if ((half - c) ** 2).sum(-1).max() <= r2_max:
                cens.append(c[None]), ws.append(np.array([len(half)]))
            else:
                cens.append(half), ws.append(np.ones(len(half), np.int64))
    cen = np.concatenate(cens)
    w = np.concatenate(ws) / total
    bm, idx = make_blocks(cen, dtype, block, return_index=True)
    wv = np.where(idx >= 0, w[np.maximum(idx, 0)], 0.0).reshape(-1)
    return bm, jnp.asarray(wv, dtype)


def _sparse_c_transform(rows_pts, rows_valid, keys_pts, pots, eps, lw, nbr, *, block):
    """``ε log w - listed_lse(...)`` on the valid rows, -inf on the padding, for each potential of ``pots``.

    Run inside :func:`jaxdyn.kernels._blocks.on_lists`' program: run eagerly, a ``lax.map`` is a
    fresh closure at every call and would be compiled again at every call.

    Returns:
        The potentials on the rows, one (n,) array a potential of ``pots``.
    """

    def one(pot):
        return jnp.where(rows_valid,
                         eps * lw - listed_lse(rows_pts, keys_pts, pot, eps, nbr, block=block),
                         jnp.asarray(-jnp.inf, rows_pts.dtype))

    return tuple(jax.lax.map(one, jnp.stack(pots)))


def _carry_pots(rx: Blocks, ry: Blocks, lwx, lwy, kx, ky, eps, pots, sparse=None):
    """Potentials on the rows of ``rx``, ``ry`` from a solution ``pots`` on the keys ``kx``, ``ky``.

    One c-transform each at ``eps`` (log weights ``lwx``, ``lwy``); -inf on the padding.
    Dense (keys: point arrays), or with ``sparse = (block, margin)`` block-sparse (keys:
    leaves, the intermediate level): each c-transform visits only the key blocks that the
    bounds of :func:`leaf_margins` (without its exact level) keep at ``margin`` (the
    dropped terms weigh < M e^{-margin}), a fraction of the dense c-transform's N · N / MID
    terms.

    Returns:
        ((f, g), (fx, fx), (fy, fy)) on the rows.
    """
    (fc, gc), (fxc, _), (fyc, _) = pots
    dtype = rx.pts.dtype
    e = jnp.asarray(eps, dtype)
    ninf = jnp.asarray(-jnp.inf, dtype)

    if sparse is None:
        def one(rows, keys, pot, lw):
            return jnp.where(rows.valid, c_transform_from_coarse(rows.pts, keys, pot, e, lw), ninf)

        f, g = one(rx, ky, gc, lwx), one(ry, kx, fc, lwy)
        fx, fy = one(rx, kx, fxc, lwx), one(ry, ky, fyc, lwy)
        return ((f, g), (fx, fx), (fy, fy))
    block, margin = sparse
    args = ((rx, ky, gc, lwx), (ry, kx, fc, lwy), (rx, kx, fxc, lwx), (ry, ky, fyc, lwy))
    keeps = [leaf_margins(rows, keys, pot, eps, block, margin, exact=False) >= -margin
             for rows, keys, pot, _ in args]
    cap = max(list_length(k) for k in keeps)  # one length: one program for the four

    def one(rows, keys, pot, lw, keep):
        return on_lists(_sparse_c_transform, (rows.pts, rows.valid, keys.pts, (pot,), e, lw),
                         jnp.asarray(keep), cap=cap, block=block)[1][0]

    f, g, fx, fy = (one(*a, k) for a, k in zip(args, keeps))
    return ((f, g), (fx, fx), (fy, fy))


def fine_round_limit(max_rounds: int) -> int:
    """The most rounds on the points (and on the intermediate level) for ``max_rounds`` ε rounds.

    Each falls at most ``FINE_ROUND_RATIO`` where the ε ladder falls up to 100x a round.

    Returns:
        ``ceil(max_rounds · log 100 / log FINE_ROUND_RATIO)``.
    """
    return int(math.ceil(max_rounds * math.log(100.0) / math.log(FINE_ROUND_RATIO)))


class _Opts(NamedTuple):
    """What every level's ladder takes: the ε rule and the rounds' options."""

    rule: object  # w2_sinkhorn's ε rule: (eps, div) -> next ε or None
    kw: dict  # the options of w2_sinkhorn's rounds
    fine_kw: dict  # the sparse rounds' options
    attempt_kw: dict  # an attempt of a round of the intermediate level
    first_kw: dict  # the first attempt of its first round
    rounds: int  # the most rounds of a level


def _options(rule, kw, block, max_rounds) -> _Opts:
    """The sparse rounds' options from ``w2_sinkhorn``'s.

    The (x, y) over-relaxation re-estimated at every error check, from
    ``FINE_MOMENTUM_START`` on; the intermediate level's rounds in attempts of at most
    ``ATTEMPT_ITERATIONS``, its first ``FIRST_ATTEMPT``.

    Returns:
        :class:`_Opts`.
    """
    fine_kw = {**kw, "batch_size": None, "block": block, "reestimate": True,
               "momentum_start": min(kw["momentum_start"], FINE_MOMENTUM_START)}
    most = int(kw["max_iterations"])
    return _Opts(rule, kw, fine_kw, {**fine_kw, "max_iterations": min(most, ATTEMPT_ITERATIONS)},
                 {**fine_kw, "max_iterations": min(most, ATTEMPT_ITERATIONS, FIRST_ATTEMPT)},
                 fine_round_limit(max_rounds))


def _coarse_level(bx: Blocks, by: Blocks, eps0, epsilon, max_rounds, opts: _Opts):
    """The large-ε part of the ladder on the weighted sub-block centroids (SUB points each).

    Down to ``COARSE_FLOOR`` × their median squared radius, where they stop resolving the
    kernel.

    Returns:
        ``(eps, n_iterations, ε list, divergence list, info, history)``: the last ε, the
        ladder's lists, its final potentials (``info["pots"]``) and the (ε, potentials) of
        every round.
    """
    dtype = bx.pts.dtype
    cnt_x = np.asarray(bx.valid).reshape(-1, SUB).sum(1)
    cnt_y = np.asarray(by.valid).reshape(-1, SUB).sum(1)
    wa, wb = jnp.asarray(cnt_x / cnt_x.sum(), dtype), jnp.asarray(cnt_y / cnt_y.sum(), dtype)
    radii = np.concatenate([np.asarray(bx.sub_radii)[cnt_x > 0],
                            np.asarray(by.sub_radii)[cnt_y > 0]])
    eps_c = COARSE_FLOOR * float(np.median(radii ** 2))
    cx, cy = bx.sub_centers, by.sub_centers
    nbx, nby = cx.shape[0], cy.shape[0]
    coarse_kw = {**opts.kw, "batch_size": None if nbx * nby <= 2**24 else 1024}
    hist = []  # (ε, centroid potentials) of every coarse round

    def solve(eps, eps_prev, init):
        out = _debiased_round(cx, cy, eps, eps_prev, init, wa, wb, **coarse_kw)
        hist.append((float(eps), out[1]))
        _log(f"coarse n={nbx} eps={float(eps):.3e} start={float(eps_prev):.3e} "
             f"it={np.asarray(out[3]).tolist()} div={float(out[0]):.8e}")
        return out

    def rule(eps, div):
        nxt = opts.rule(eps, div)
        if nxt is None or eps <= eps_c:
            return None
        return max(nxt, eps_c)

    z = lambda k: jnp.zeros((k,), dtype)  # noqa: E731
    init = ((z(nbx), z(nby)), (z(nbx), z(nbx)), (z(nby), z(nby)))
    # a fixed ε above ε0 is solved at that ε (as the dense path does), not at ε0
    start = eps0 if epsilon is None else max(eps0, float(epsilon))
    eps, _, _, n_it, c_eps, c_div, info = _ladder(solve, start, eps0, init, rule, max_rounds)
    return eps, n_it, c_eps, c_div, info, hist


def _start_pots(hist, eps, pots):
    """A round's starting potentials and the ε it anneals from.

    ``pots`` annealed from the last round's ε, or (two rounds known) their linear
    extrapolation in ε to ``eps``, at ``eps``. Potentials are smooth in ε (f_ε = f_0 + ε h + ...): from their extrapolation, the slow,
    smooth part of the correction is mostly done.

    Returns:
        ``(pots, start)``, or ``(pots, None)`` to keep the annealing start.
    """
    if len(hist) < 2:
        return pots, None
    if hist[-2][0] == hist[-1][0]:  # a coarser level's solution at the same ε
        return hist[-1][1], eps
    return _extrapolate(hist[-2], hist[-1], eps), eps


def _log_round(label, lx, ly, eps, start, iters, div, nbrs):
    """The ``JAXDYN_W2_LOG`` line of an attempt of a round."""
    if not os.environ.get("JAXDYN_W2_LOG"):
        return
    dens = ",".join(f"{list_density(np.asarray(q), k.centers.shape[0]):.3f}"
                    for q, k in zip(nbrs, (ly, lx, lx, ly)))
    _log(f"{label} n={int(np.asarray(lx.valid).sum())} eps={eps:.3e} start={float(start):.3e} "
         f"it={np.asarray(iters).tolist()} div={div:.8e} dens={dens} "
         f"K={[int(q.shape[1]) for q in nbrs]}")


def _round(lx, ly, wx, wy, sel, eps, start, pots, nbrs, certify, first, label, opts):
    """One round of a level's ladder at ``eps`` on the lists ``nbrs``: its attempts and check.

    ``certify`` (the points): the last round's lists are checked at its final potentials
    and the round rerun with the union of both selections while a needed block is missing.
    Otherwise (the intermediate level, which only warm-starts the points) the round runs in
    attempts; after one that did not converge, lists that lack blocks the potentials reached
    need are completed, and lists that cover them go on up to ``ATTEMPT_LIMIT`` iterations
    (lists selected from a round's starting potentials may carry no plan with the marginals:
    Sinkhorn then never converges).

    Returns:
        ``(div, pots, converged, certified, iterations, nbrs, next ε)``.
    """
    budget = int(opts.kw["max_iterations"])  # per round and per problem, all attempts
    round_kw = opts.fine_kw if certify else opts.first_kw if first else opts.attempt_kw
    n_it, spent, checks, certified = 0, 0, 0, False
    while True:
        pots = _centre_components(pots, np.asarray(nbrs[0]), np.asarray(nbrs[1]), wx, wy)
        div_j, new_pots, conv, iters = _debiased_round(lx.pts, ly.pts, eps, start, pots, wx, wy,
                                                       nbrs, **round_kw)
        round_kw = opts.fine_kw if certify else opts.attempt_kw
        n_it += int(np.asarray(iters)[0])
        n_last = int(np.max(np.asarray(iters)))
        budget -= n_last
        div, converged = float(div_j), bool(np.all(np.asarray(conv)))
        _log_round(label, lx, ly, eps, start, iters, div, nbrs)
        if not np.isfinite(div):
            return div, pots, converged, False, n_it, nbrs, None
        pots, start = new_pots, eps
        if not converged and not certify:
            spent += n_last
            if budget > 0 and n_last > 0 and not sel.covers(pots, eps):
                nbrs = sel.update(pots, eps, fresh=False, extra=_SELECT_EXTRA)
                spent = 0
                _log(f"{label}: not converged in {n_last} iterations, blocks missing; "
                     "reselect and go on")
                continue
            if budget > 0 and n_last > 0 and spent < ATTEMPT_LIMIT:
                _log(f"{label}: not converged in {spent} iterations, lists cover; go on")
                continue
            _log(f"{label}: not converged in {spent} iterations; its potentials warm-start "
                 "the next round")
        nxt = opts.rule(eps, div)
        if nxt is not None or not certify:
            # not the last round: its potentials only start the next one, which selects
            # its own lists; only the last round's selection must pass the check
            return div, pots, converged, False, n_it, nbrs, nxt
        certified = sel.covers(pots, eps)
        _log(f"check covers={certified}")
        checks += 1
        if certified or checks > _MAX_RESELECT:
            return div, pots, converged, certified, n_it, nbrs, nxt
        # a block was missing: rerun with the union of both selections
        nbrs = sel.update(pots, eps, fresh=False, extra=_SELECT_EXTRA)


def _ladder_on(lx, ly, wx, wy, sel, eps, eps_prev, pots, hist, certify, label, opts: _Opts):
    """The ε ladder of sparse rounds on the leaves ``lx``, ``ly`` (weights ``wx``, ``wy``) from ``eps``.

    ``certify``: check the last round's lists (else the ladder only warm-starts a finer
    level). ``hist`` holds the (ε, potentials) of the rounds so far (appended to).

    Returns:
        (eps, div, converged, certified, iterations, ε list, divergence list,
        potentials, density).
    """
    eps_list, div_list = [], []
    n_it, converged, certified, div, dens = 0, False, False, float("nan"), 1.0
    nbrs, prev_eps = None, float("inf")
    for r in range(opts.rounds):
        pots, start = _start_pots(hist, eps, pots)
        start = eps_prev if start is None else start
        if nbrs is not None and eps >= REUSE_LISTS_ABOVE * prev_eps:
            # ε barely moved: the last lists (margin T + 4 at the previous ε) serve; the
            # final check certifies them as any others
            _log(f"reuse {label} lists eps={eps:.3e}")
        else:
            # selected at the round's target ε (tight lists; checked again at the end)
            nbrs = sel.update(pots, eps, extra=_SELECT_EXTRA)
            _log(f"select {label} eps={eps:.3e}")
        prev_eps = eps
        div, pots, converged, certified, k, nbrs, nxt = _round(
            lx, ly, wx, wy, sel, eps, start, pots, nbrs, certify, r == 0, label, opts)
        n_it += k
        eps_list.append(float(eps))
        div_list.append(div)
        hist.append((float(eps), pots))
        dens = list_density(np.asarray(nbrs[0]), ly.centers.shape[0])
        if not np.isfinite(div):
            converged = False
            break
        if nxt is None:
            break
        eps_prev, eps = eps, max(nxt, eps / (FINE_ROUND_RATIO if certify else MID_ROUND_RATIO))
    else:
        converged = False
    return eps, div, converged, certified, n_it, eps_list, div_list, pots, dens


def _predicted_end(eps, div, rule, max_rounds):
    """The ladder's final ε as predicted from the coarse divergence ``div``.

    The rule asks for ε in proportion to the divergence, and S_ε barely moves below the
    coarse floor.

    Returns:
        The predicted final ε.
    """
    for _ in range(max_rounds):
        nxt = rule(eps, div) if np.isfinite(div) else None
        if nxt is None or nxt >= eps:
            break
        eps = nxt
    return eps


def _mid_level(bx, by, n, m, eps, coarse, max_rounds, opts: _Opts):
    """The ladder below the coarse floor on the intermediate level, to its end.

    The weighted centroids of runs of ``MID`` rows (:func:`_mid_cloud`, compact at the
    predicted final ε), from the coarse solution ``coarse = (c_div, history, cx, cy)``
    carried to them; sparse rounds at margin ``log(M / MID) + MID_MARGIN_EXTRA``, no
    certificate (it only warm-starts the points).

    Returns:
        ``(eps, div, iterations, ε list, potentials, leaves x, leaves y)``.
    """
    c_div, chist, cx, cy = coarse
    dtype, block = bx.pts.dtype, opts.fine_kw["block"]
    cpots = (_extrapolate(chist[-2], chist[-1], eps)
             if len(chist) >= 2 and chist[-2][0] != chist[-1][0] else chist[-1][1])
    eps_end = _predicted_end(eps, c_div[-1], opts.rule, max_rounds)
    mx, wmx = _mid_cloud(bx, dtype, block, MID_SPREAD * eps_end)
    my, wmy = _mid_cloud(by, dtype, block, MID_SPREAD * eps_end)
    nbm = _common_leaves(mx.centers.shape[0], my.centers.shape[0])
    wmx = jnp.concatenate([wmx, jnp.zeros(((nbm - mx.centers.shape[0]) * block,), dtype)])
    wmy = jnp.concatenate([wmy, jnp.zeros(((nbm - my.centers.shape[0]) * block,), dtype)])
    mx, my = _pad_leaves(mx, nbm, block), _pad_leaves(my, nbm, block)
    _log(f"mid points {int(np.asarray(mx.valid).sum())}, {int(np.asarray(my.valid).sum())} "
         f"(groups compact at eps={eps_end:.3e})")
    mpots = _carry_pots(mx, my, jnp.log(wmx), jnp.log(wmy), cx, cy, eps, cpots)
    msel = _Selection(mx, my, block, math.log(max(n, m) / MID) + MID_MARGIN_EXTRA)
    out = _ladder_on(mx, my, wmx, wmy, msel, eps, eps, mpots, [(eps, mpots)], False, "mid",
                     opts)
    return out[0], out[1], out[4], out[5], out[7], mx, my


def w2_multiscale(x, y, *, eps0, rule, epsilon, max_rounds, block=FINE_BLOCK, **kw):
    """The multiscale ε ladder behind ``w2_sinkhorn(..., multiscale=True)``.

    ``rule(eps, div)`` is w2_sinkhorn's ε rule (next ε or None); ``kw`` the round options.
    Three levels: the sub-block centroids (:func:`_coarse_level`), the intermediate level
    (:func:`_mid_level`), then the points, whose last round is certified.

    Returns:
        What :func:`jaxdyn.distances._rounds._ladder` returns (eps, div, converged and
        certified, iterations, ε list, divergence list, info).
    """
    dtype = x.dtype
    n, m = x.shape[0], y.shape[0]
    bx, by = make_blocks(np.asarray(x), dtype, block), make_blocks(np.asarray(y), dtype, block)
    opts = _options(rule, kw, block, max_rounds)
    eps, n_total, c_eps, c_div, info, chist = _coarse_level(bx, by, eps0, epsilon, max_rounds,
                                                            opts)
    cx, cy = bx.sub_centers, by.sub_centers
    # x and y at one leaf count (empty leaves appended): the rounds' and the selection's
    # programs then take both clouds' lists at one shape
    nb = _common_leaves(bx.centers.shape[0], by.centers.shape[0])
    bx, by = _pad_leaves(bx, nb, block), _pad_leaves(by, nb, block)
    la, lb = jnp.asarray(-math.log(n), dtype), jnp.asarray(-math.log(m), dtype)
    a = jnp.where(bx.valid, jnp.asarray(1.0 / n, dtype), jnp.zeros((), dtype))
    b = jnp.where(by.valid, jnp.asarray(1.0 / m, dtype), jnp.zeros((), dtype))
    sel = _Selection(bx, by, block, math.log(max(n, m)) + _MARGIN_EXTRA)
    eps_prev = eps
    # the first round below the coarse floor anneals on from the coarse ladder's last ε
    nxt = rule(eps, c_div[-1]) if (c_div and np.isfinite(c_div[-1])) else None
    if nxt is not None:
        eps = max(nxt, eps / MID_ROUND_RATIO)
    eps_m, div_m, n_mid, mid_eps, mpots, mx, my = _mid_level(
        bx, by, n, m, eps, (c_div, chist, cx, cy), max_rounds, opts)
    n_total += n_mid
    hist = []  # (ε, potentials) of the finished rounds on the points
    if np.isfinite(div_m):
        # the points start a little below the intermediate level's final ε: its divergence
        # slightly exceeds the points', so at eps_m the rule (stop once ε <= rel_epsilon ·
        # S_ε) would ask for one or two more rounds on the points (docs/math.md §D.4,
        # item 9); a fixed ε is never undercut
        eps = eps_prev = max(eps_m * (1.0 - MID_EPS_BELOW),
                             -np.inf if epsilon is None else float(epsilon))
        pots = _carry_pots(bx, by, la, lb, mx, my, eps, mpots, sparse=(block, sel.margin))
        hist = [(eps, pots)]
        _log("carried mid")
    else:  # the intermediate level failed: start from the coarse solution
        pots = _carry_pots(bx, by, la, lb, cx, cy, eps_prev, info["pots"])
    (eps, div, converged, certified, n_fine, eps_list, div_list, pots,
     dens) = _ladder_on(bx, by, a, b, sel, eps, eps_prev, pots, hist, True, "fine", opts)
    info = {"geometry": "multiscale", "kernel_density": dens, "coarse_epsilons": c_eps,
            "coarse_divergences": c_div, "mid_epsilons": mid_eps, "pots": pots}
    return (eps, div, converged and certified, n_total + n_fine, c_eps + eps_list,
            c_div + div_list, info)
