r"""The block-sparse core: softmax attention that visits only the key blocks that can matter.

At low temperature a query's softmax mass sits on the keys within an angle of order β^{-1/2}
of its direction; almost every pair of a dense pass contributes ``e^{-thousands}``. This module
skips those pairs *with a certificate* (docs/math.md, "Local attention"):

1. **Ordering.** Queries and keys are sorted along a space-filling curve of their positions
   (on the unit sphere a cube map with a Hilbert curve on each face; other clouds a Morton
   curve of their bounding box, in their three leading principal coordinates when they have
   more) and cut into leaves of ``leaf`` consecutive points; ``group`` consecutive leaves
   form a coarse cluster. The ordering is rebuilt at every call (one sort of the points), so
   moving particles never need a separate rebuild.
2. **Caps.** Every leaf and cluster carries bounding balls: of its keys ``k_j`` (centre,
   radius, largest ``|k_j|²``), and of its queries ``q_i`` and their directions
   ``q̂_i = q_i / |q_i|`` (with the range of ``|q_i|``).
3. **A lower bound of each row's largest logit.** A first pass over one key leaf per query
   leaf (the leaf at the query's place in the key order) gives ``m_i = max_j l_ij`` over
   that leaf, and ``e_i = max_j (|k_j|² − |q̂_i − k_j|²)``.
4. **Bounds and lists.** For a row i and a key leaf J, every logit obeys both

       l_ij − m_i ≤ (|q_i| / 2) (max_J |k|² − dist(q̂_i, ball_J)² − e_i)        (quadratic)
       l_ij − m_i ≤ q_i · (c_J − c_I) + |q_i| r_J − (m_i − q_i · c_I)            (linear)

   (the first from ``q̂·k = (|q̂|² + |k|² − |q̂ − k|²) / 2``: tight for keys on a sphere;
   the second for keys anywhere), bounded over the rows of a leaf or cluster with their
   balls, plus a rounding slack of a few ulps of the logits. A key cluster, then a key leaf,
   is skipped iff its bound ``b`` satisfies ``b ≤ −T``, ``T = log(2 m / tol)``: the skipped
   mass of a row is at most ``m e^{−T} = tol / 2`` of ``e^{m_i}``, itself at most the row's
   kept mass. Lists have fixed capacities (``capacity``); an overflow is detected, never
   truncated: the blocked kernel answers instead (or NaN, ``on_overflow="nan"``). The
   balls, the quadratic bound's ball distances and the list builder are the block-sparse
   core's (:func:`._blocks.balls`, :func:`._sparse.ball_distances`,
   :func:`._blocks.pack_lists`), shared with the multiscale W2 solver, whose logits
   ``(g_j − |x_i − y_j|²) / ε`` are the same kind of score (:mod:`._sparse`).
5. **Tiles.** The kept (query leaf, key leaf) tiles run the online-softmax recurrence of
   :func:`._online.running_update` on centred logits ``q_i · (k_j − c_I)`` (the row constant
   ``q_i · c_I`` cancels in softmax weights, and the centred products keep their precision
   at β of 10⁷ in float32). Query leaves are taken in chunks ordered by list length; a
   chunk loops over its longest list. The derivative is a second pass over the same tiles
   (``jax.custom_vjp``, the flash-attention backward pass): memory O(N), never a tile kept.
6. **The realised bound.** ``s_i = (skipped bound of row i) / (kept mass of row i)`` is
   returned with the result (``with_stats``); the average then differs from the dense one
   by at most ``2 s_i max_j |v_j| ≤ tol max_j |v_j|``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._blocks import Balls, balls, pack_lists
from ._online import HIGHEST, all_at_most, finite_or_zero, ratio, running_update
from ._sparse import ball_distances

__all__ = ["DEFAULT_TOL", "LEAF", "LocalStats", "Ordering", "default_group", "local_attention",
           "spatial_order"]

#: the default tolerance: the field's error relative to ``max_j |v_j|``
DEFAULT_TOL = 1e-6
#: points per leaf
LEAF = 64
#: the first crude level has at most this many super-clusters a side (its bound matrix is
#: square in it)
COARSE_MAX = 8192
#: clusters a super-cluster (the first crude level)
SUPER = 8
#: query clusters a batch of the selection's loops (the clusters taken in the order of their
#: loops' lengths, so that a batch's loop runs to about its own longest: :func:`_map_by_trips`)
SELECT_BATCH = 512
#: query leaves a chunk of the tile passes
CHUNK = 128
#: the default list capacity (key leaves a query leaf): a quarter of the key leaves (what
#: ``kernel="auto"`` takes at most), at least CAPACITY, while the lists hold at most
#: LIST_ENTRIES. The selection's loops carry the lists, so their cost grows with the slots:
#: they list into CAPACITY slots wherever every list fits there.
CAPACITY = 256
LIST_ENTRIES = 2 ** 24
#: the fixed reference is taken while the largest kept bound stays below half of these
_SAFE = {"float32": 60.0, "float64": 600.0}
ON_OVERFLOW = ("blocked", "nan")


class LocalStats(NamedTuple):
    """What the local kernel skipped, and its certificate.

    Attributes:
      mass: (n,) the certified bound of each row's skipped softmax mass relative to its kept
        mass (at most ``tol / 2``).
      bound: (n,) the certified bound of ``|m_i − m_i^dense| / max_j |v_j|``: ``2 · mass``
        (at most ``tol``).
      visited: scalar, the fraction of the n · m (query, key) pairs computed (1 where the
        blocked kernel answered).
      listed: scalar, the fraction of the pairs that the lists hold.
      overflow: boolean scalar, a list capacity was exceeded (the result then came from the
        blocked kernel, or is NaN under ``on_overflow="nan"``).
      kept: (2,) int, the longest list of key clusters and of key leaves (the latter against
        ``capacity``).
      dense: boolean scalar, the blocked kernel answered (an overflow, or ``"auto"`` found
        the lists too long to pay).
    """

    mass: jax.Array
    bound: jax.Array
    visited: jax.Array
    listed: jax.Array
    overflow: jax.Array
    kept: jax.Array
    dense: jax.Array


class Ordering(NamedTuple):
    """Points sorted along a space-filling curve and cut into leaves.

    Attributes:
      perm: (nl · leaf,) int32, the point at each sorted place (padding repeats the last).
      valid: (nl · leaf,) bool, False on the padding.
      codes: (nl · leaf,) uint32 curve codes at the sorted places (nondecreasing).
    """

    perm: jax.Array
    valid: jax.Array
    codes: jax.Array


# ----------------------------------------------------------------------------- ordering


def _part1by2(v):
    """Spread the low 10 bits of ``v`` (uint32) to every third bit."""
    v = v & jnp.uint32(0x3FF)
    v = (v | (v << 16)) & jnp.uint32(0xFF0000FF)
    v = (v | (v << 8)) & jnp.uint32(0x0300F00F)
    v = (v | (v << 4)) & jnp.uint32(0x030C30C3)
    return (v | (v << 2)) & jnp.uint32(0x09249249)


def _part1by1(v):
    """Spread the low 16 bits of ``v`` (uint32) to every other bit."""
    v = v & jnp.uint32(0xFFFF)
    v = (v | (v << 8)) & jnp.uint32(0x00FF00FF)
    v = (v | (v << 4)) & jnp.uint32(0x0F0F0F0F)
    v = (v | (v << 2)) & jnp.uint32(0x33333333)
    return (v | (v << 1)) & jnp.uint32(0x55555555)


def _frame(points):
    """The coordinates the curve runs in: at most three (the leading principal axes)."""
    pts = jnp.nan_to_num(jax.lax.stop_gradient(points).astype(jnp.float32))
    if pts.shape[1] <= 3:
        return lambda a: jnp.nan_to_num(jax.lax.stop_gradient(a).astype(jnp.float32)), pts
    mean = jnp.mean(pts, axis=0)
    cov = jnp.matmul((pts - mean).T, pts - mean, precision=HIGHEST)
    axes = jnp.linalg.eigh(cov)[1][:, -3:]

    def proj(a):
        a = jnp.nan_to_num(jax.lax.stop_gradient(a).astype(jnp.float32))
        return jnp.matmul(a - mean, axes, precision=HIGHEST)

    return proj, proj(points)


def _codes(c, lo, span):
    """Morton codes (uint32) of coordinates ``c`` (n, ≤ 3) in the box ``lo + [0, span]``."""
    c = jnp.asarray(c)
    dims = c.shape[1]
    bits = {1: 31, 2: 15, 3: 10}[dims]  # codes below 2^31: at most SEGMENTS segments
    top = float(2 ** bits - 1)
    cell = jnp.clip(jnp.floor((c - lo) / span * top + 0.5), 0.0, top).astype(jnp.uint32)
    if dims == 1:
        return cell[:, 0]
    if dims == 2:
        return _part1by1(cell[:, 0]) | (_part1by1(cell[:, 1]) << 1)
    return _part1by2(cell[:, 0]) | (_part1by2(cell[:, 1]) << 1) | (_part1by2(cell[:, 2]) << 2)


def _hilbert2(x, y, bits):
    """Hilbert-curve index of the cells ``(x, y)`` (uint32, ``bits`` bits each)."""
    top = jnp.uint32(2 ** bits - 1)
    d = jnp.zeros_like(x)
    for b in range(bits - 1, -1, -1):
        s = jnp.uint32(1 << b)
        rx = (x & s) > 0
        ry = (y & s) > 0
        d = d + jnp.uint32(1 << (2 * b)) * ((3 * rx.astype(jnp.uint32)) ^ ry.astype(jnp.uint32))
        flip = ~ry & rx
        x, y = jnp.where(flip, top - x, x), jnp.where(flip, top - y, y)
        x, y = jnp.where(ry, x, y), jnp.where(ry, y, x)
    return d


def _sphere_codes(c):
    """Cube-map codes of points on the unit sphere (None for more than four coordinates)."""
    # the face of the cube a point projects to, then a Hilbert (S²) or Morton (S³) curve on
    # that face; the angle on S¹
    p = c.shape[1]
    if p == 2:
        ang = jnp.arctan2(c[:, 1], c[:, 0])
        return jnp.clip(jnp.floor((ang + math.pi) / (2 * math.pi) * 2.0 ** 31), 0,
                        2.0 ** 31 - 1).astype(jnp.uint32)
    if p > 4:
        return None
    a = jnp.abs(c)
    axis = jnp.argmax(a, axis=1)
    big = jnp.take_along_axis(c, axis[:, None], axis=1)
    face = (2 * axis + (big[:, 0] < 0)).astype(jnp.uint32)
    others = jnp.stack([jnp.where(axis[:, None] <= i, c[:, i + 1:i + 2], c[:, i:i + 1])[:, 0]
                        for i in range(p - 1)], axis=1)
    uv = others / jnp.where(big == 0, 1.0, jnp.abs(big))
    bits = 14 if p == 3 else 9
    top = float(2 ** bits - 1)
    cell = jnp.clip(jnp.floor((uv + 1.0) * 0.5 * top + 0.5), 0.0, top).astype(jnp.uint32)
    if p == 3:
        return (face << 28) | _hilbert2(cell[:, 0], cell[:, 1], bits)
    return (face << 28) | (_part1by2(cell[:, 0]) | (_part1by2(cell[:, 1]) << 1)
                           | (_part1by2(cell[:, 2]) << 2))


def _curve(points, lo, span):
    """Codes along the curve (the cube map on the unit sphere, to 1 %, else the box's)."""
    raw = jnp.nan_to_num(jax.lax.stop_gradient(points).astype(jnp.float32))
    box = _codes(lo[1](raw), lo[0], span)
    sph = _sphere_codes(raw)
    if sph is None:
        return box
    on_sphere = jnp.all(jnp.abs(jnp.sum(raw * raw, axis=1) - 1.0) < 0.02)
    return jnp.where(on_sphere, sph, box)


#: the curve's top bits that start a segment (a cube face, an octant of the box)
SEGMENT_SHIFT = 28
SEGMENTS = 8


def _host_sort(codes):
    """``(sorted codes, stable order)`` by NumPy: one sort of ``code · 2³² + place`` (uint64).

    Returns:
      ``(sorted codes, perm)`` along the last axis: uint32 and int32.
    """
    c = np.asarray(codes)
    n = c.shape[-1]
    key = np.sort((c.astype(np.uint64) << np.uint64(32)) | np.arange(n, dtype=np.uint64),
                  axis=-1)
    return ((key >> np.uint64(32)).astype(np.uint32),
            (key & np.uint64(0xFFFFFFFF)).astype(np.int32))


def _sort_codes(codes):
    """``(sorted codes, perm)``: the stable order of the curve codes (uint32).

    On the CPU by NumPy's vectorised sort of packed 64-bit keys (a host callback: XLA's CPU
    ``lax.sort`` with two operands is far slower at millions of points); on accelerators by
    ``lax.sort``.

    Returns:
      ``(sorted codes, perm)``: (n,) uint32 and (n,) int32.
    """
    n = codes.shape[0]

    def device(c):
        return jax.lax.sort((c, jnp.arange(n, dtype=jnp.int32)), num_keys=1)

    def host(c):
        shapes = (jax.ShapeDtypeStruct((n,), jnp.uint32), jax.ShapeDtypeStruct((n,), jnp.int32))
        return jax.pure_callback(_host_sort, shapes, c, vmap_method="expand_dims")

    return jax.lax.platform_dependent(codes, cpu=host, default=device)


def _sorted(codes, size, unit):
    """The :class:`Ordering` of ``codes`` in ``size`` places."""
    # each segment of the curve (top code bits) starts a new cluster of ``unit`` places when
    # ``size`` holds the spare places
    n = codes.shape[0]
    sc, perm = _sort_codes(codes)
    if size < n + SEGMENTS * unit:
        perm = jnp.concatenate([perm, jnp.broadcast_to(perm[-1], (size - n,))])
        return Ordering(perm, jnp.arange(size) < n, codes[perm])
    seg = (sc >> SEGMENT_SHIFT).astype(jnp.int32)
    count = jnp.zeros((SEGMENTS,), jnp.int32).at[seg].add(1)
    room = (count + unit - 1) // unit * unit
    place = (jnp.cumsum(room) - room)[seg] + jnp.arange(n) - (jnp.cumsum(count) - count)[seg]
    full = jnp.full((size,), -1, jnp.int32).at[place].set(perm, unique_indices=True)
    valid = full >= 0
    last = jax.lax.cummax(jnp.where(valid, jnp.arange(size), 0))
    full = full[last]
    return Ordering(full, valid, codes[full])


def spatial_order(x, y=None, *, leaf=LEAF, group=None):
    """Orderings of queries ``x`` and keys ``y`` along one space-filling curve, cut into leaves.

    Points on the unit sphere (every norm within 1 %) follow a cube map (the face a point
    projects to, then a Hilbert curve on the face in S², a Morton curve in S³, the angle
    on S¹); other clouds a Morton curve of their bounding box (in their three leading
    principal coordinates when they have more). Each segment of the curve (a cube face, a
    box octant) starts a new cluster once the cloud is large enough for the spare places.

    Args:
      x: (n, p) query positions.
      y: (m, p) key positions, or None (self-attention: the keys are ``x``).
      leaf: points per leaf.
      group: leaves per coarse cluster (None: :func:`default_group` of the keys).

    Returns:
      ``(order_x, order_y, locate)``: :class:`Ordering` (the same object twice when ``y`` is
      None), each padded to a whole number of clusters, and ``locate(points)``, the codes of
      other points on the same curve.
    """
    both = x if y is None else jnp.concatenate([x, y])
    proj, cx = _frame(both)
    lo = jnp.min(cx, axis=0)
    span = jnp.maximum(jnp.max(cx, axis=0) - lo, 1e-30)

    def locate(points):
        return _curve(points, (lo, proj), span)

    codes = locate(both)
    n = x.shape[0]
    m = n if y is None else y.shape[0]
    g = group or default_group(m, leaf)
    if y is None:
        ox = _sorted(codes, _padded(n, leaf, g), leaf * g)
        return ox, ox, locate
    return (_sorted(codes[:n], _padded(n, leaf, g), leaf * g),
            _sorted(codes[n:], _padded(m, leaf, g), leaf * g), locate)


def default_group(m: int, leaf: int = LEAF) -> int:
    """Leaves per cluster: a power of two, at least 8, with at most ``COARSE_MAX`` super-clusters.

    Args:
      m: number of points.
      leaf: points per leaf.

    Returns:
      The group size.
    """
    g = 8
    while math.ceil(m / (leaf * g * SUPER)) > COARSE_MAX:
        g *= 2
    return g


def _padded(n, leaf, group):
    """Places of a cloud of n points (whole clusters and chunks, room for the segments)."""
    # every segment of the curve starts a cluster where that costs at most 1/4 more places
    unit = leaf * group
    size = max(1, math.ceil(n / unit)) * unit
    if SEGMENTS * unit * 4 <= n:
        size += SEGMENTS * unit
    if size > leaf * CHUNK:  # whole chunks of query leaves for the tile passes
        whole = leaf * max(group, CHUNK)
        size = math.ceil(size / whole) * whole
    return size


# ----------------------------------------------------------------------------- caps


def _merge(b: Balls, group):
    """Balls of clusters of ``group`` consecutive leaves enclosing the leaves' balls."""
    nb, p = b.centre.shape
    c = b.centre.reshape(nb // group, group, p)
    cc = jnp.mean(c, axis=1)
    r = jnp.max(jnp.linalg.norm(c - cc[:, None, :], axis=-1)
                + b.radius.reshape(nb // group, group), axis=1)
    return Balls(cc, r)


class _Keys(NamedTuple):
    ball: Balls          # keys' balls
    nu: jax.Array        # largest |k|²
    count: jax.Array     # valid keys


class _Queries(NamedTuple):
    ball: Balls          # the queries' ball (linear bound)
    dirs: Balls          # their directions' ball (quadratic bound)
    rho: jax.Array       # (nb, 2): least and largest |q|
    e: jax.Array         # least e_i
    w: jax.Array         # largest −m̃_i (a cluster: plus |q_i| |c_cluster − c_I|)
    centre: jax.Array    # (nb, p): the centring point (key space)


def _key_leaves(ks, valid):
    nu = jnp.max(jnp.sum(ks * ks, axis=-1), axis=1)
    return _Keys(balls(ks), nu, jnp.sum(valid, axis=1).astype(ks.dtype))


def _key_clusters(keys: _Keys, group):
    nb = keys.nu.shape[0]
    return _Keys(_merge(keys.ball, group), jnp.max(keys.nu.reshape(nb // group, group), axis=1),
                 jnp.sum(keys.count.reshape(nb // group, group), axis=1))


def _query_leaves(qs, centre, m_row, e_row, qvalid):
    # over the valid rows: a leaf of padding alone has e = +inf, w = -inf (nothing to bound)
    rho = jnp.linalg.norm(qs, axis=-1)
    dirs = qs / jnp.where(rho > 0, rho, 1.0)[..., None]
    return _Queries(balls(qs), balls(dirs),
                    jnp.stack([jnp.min(rho, axis=1), jnp.max(rho, axis=1)], axis=-1),
                    jnp.min(jnp.where(qvalid, e_row, jnp.inf), axis=1),
                    -jnp.min(jnp.where(qvalid, m_row, jnp.inf), axis=1), centre)


def _query_clusters(qv: _Queries, group):
    nb, p = qv.centre.shape
    nc = nb // group

    def g(a):
        return a.reshape((nc, group) + a.shape[1:])

    centre = jnp.mean(g(qv.centre), axis=1)
    shift = jnp.linalg.norm(g(qv.centre) - centre[:, None, :], axis=-1)
    rho = g(qv.rho)
    w = jnp.max(rho[..., 1] * shift + g(qv.w), axis=1)
    return _Queries(_merge(qv.ball, group), _merge(qv.dirs, group),
                    jnp.stack([jnp.min(rho[..., 0], axis=1), jnp.max(rho[..., 1], axis=1)], -1),
                    jnp.min(g(qv.e), axis=1), w, centre)


def _bounds(qv: _Queries, kv: _Keys, eps):
    """Upper bounds of ``l_ij − m_i`` over the rows of query balls and the keys of key balls.

    Args:
      qv: query balls, every field shaped (..., 1, ·).
      kv: key balls, every field shaped (1, ..., ·).
      eps: the dtype's machine epsilon (the rounding slack).

    Returns:
      (..., ...) bounds (−∞ for balls of padding alone).
    """
    rmin, rmax = qv.rho[..., 0], qv.rho[..., 1]
    empty = qv.e == jnp.inf  # query balls of padding alone
    qv = qv._replace(e=jnp.where(empty, 0.0, qv.e), w=jnp.where(empty, 0.0, qv.w))
    # quadratic: (|q_i| / 2)(ν_J − D² − e_i), D the distance of the directions' ball to J's
    gap, _ = ball_distances(qv.dirs.centre, qv.dirs.radius, kv.ball.centre, kv.ball.radius)
    s = kv.nu - gap * gap - qv.e
    quad = 0.5 * jnp.where(s >= 0, rmax, rmin) * s
    quad_slack = 2.0 * eps * rmax * (jnp.abs(kv.nu) + jnp.abs(qv.e) + gap * gap + 2.0)
    # linear: q·(c_J − c_I) + |q| r_J − m̃_i with q in the queries' ball
    dc = kv.ball.centre - qv.centre
    ndc = jnp.linalg.norm(dc, axis=-1)
    qc = jnp.sum(qv.ball.centre * dc, axis=-1)
    lin = qc + qv.ball.radius * ndc + rmax * kv.ball.radius + qv.w
    lin_slack = 4.0 * eps * (jnp.abs(qc) + qv.ball.radius * ndc + rmax * kv.ball.radius
                             + jnp.abs(qv.w) + rmax * jnp.linalg.norm(qv.centre, axis=-1))
    empty = empty | (kv.count == 0)  # or key balls of padding alone
    return jnp.where(empty, -jnp.inf, jnp.minimum(quad + quad_slack, lin + lin_slack))


# ----------------------------------------------------------------------------- tiles


#: up to this many coordinates a tile's logits are formed as a sum of broadcast products
#: (one elementwise fusion with the exponential that follows); above it, a batched product.
ELEMENTWISE_MAX = 8


def _tile(qc, kt, centre, valid):
    """Centred logits of a chunk: (C, leaf, leaf), −∞ on invalid keys."""
    kc = kt - centre[:, None, :]
    if qc.shape[-1] <= ELEMENTWISE_MAX:
        l = qc[:, :, None, 0] * kc[:, None, :, 0]
        for a in range(1, qc.shape[-1]):
            l = l + qc[:, :, None, a] * kc[:, None, :, a]
    else:
        l = jnp.einsum("cip,cjp->cij", qc, kc, precision=HIGHEST)
    return jnp.where(valid[:, None, :], l, -jnp.inf)


def _chunks(a, chunk):
    return a.reshape((a.shape[0] // chunk, chunk) + a.shape[1:])


class _Plan(NamedTuple):
    """What the tile passes need besides the operands (no derivative)."""

    kvalid: jax.Array    # (nbk, leaf) keys that are not padding
    centre: jax.Array    # (nbq, p) the centring point of each query leaf
    lists: jax.Array     # (nbq, K) key leaves
    counts: jax.Array    # (nbq,) list lengths
    shift: jax.Array     # (nbq, leaf) a fixed reference of each row, or +inf: the running max


def _forward_pass(qs, ks, vs, plan, chunk):
    """Per row: the reference ``ref_i`` and ``Σ_j e^{l_ij − ref_i} [v_j, 1]`` over its list."""
    nbq, leaf, p = qs.shape
    e = vs.shape[-1]
    # the fixed-reference tiles are (keys × queries), the queries along the vector lanes, and
    # their weighted sums a product (e, keys) @ (keys, queries), which runs faster on CPU than
    # (queries × keys) tiles times (keys, e) (``benchmarks/bench_local.py``)
    kst, vst = jnp.swapaxes(ks, 1, 2), jnp.swapaxes(vs, 1, 2)          # (nbk, p | e, leaf)

    def one(args):
        qc, cc, lc, nc, sc = args
        C = qc.shape[0]
        qt = jnp.swapaxes(qc, 1, 2)                                      # (C, p, leaf)

        def slot_fixed(k, acc):
            j = lc[:, k]
            kc = kst[j] - cc[:, :, None]           # centred keys: the logits keep their digits
            if p <= ELEMENTWISE_MAX:
                l = kc[:, 0, :, None] * qt[:, 0, None, :] - sc[:, None, :]
                for a in range(1, p):
                    l = l + kc[:, a, :, None] * qt[:, a, None, :]
            else:
                l = jnp.einsum("cpj,cpi->cji", kc, qt, precision=HIGHEST) - sc[:, None, :]
            w = jnp.where((plan.kvalid[j] & (k < nc)[:, None])[:, :, None], jnp.exp(l), 0.0)
            return acc + jnp.einsum("cej,cji->cei", vst[j], w, precision=HIGHEST)

        def slot_running(k, state):
            j = lc[:, k]
            vt = vs[j]
            l = _tile(qc, ks[j], cc, plan.kvalid[j] & (k < nc)[:, None]).reshape(C * leaf, leaf)

            def weighted(w):
                return jnp.einsum("cij,cje->cie", w.reshape(C, leaf, leaf), vt,
                                  precision=HIGHEST).reshape(C * leaf, e)

            return running_update(*state, l, weighted)

        def fixed():
            acc = jax.lax.fori_loop(0, jnp.max(nc), slot_fixed, jnp.zeros((C, e, leaf), qs.dtype))
            return sc, jnp.swapaxes(acc, 1, 2)

        def running():
            init = (jnp.full((C * leaf,), -jnp.inf, qs.dtype), jnp.zeros((C * leaf, e), qs.dtype))
            mx, acc = jax.lax.fori_loop(0, jnp.max(nc), slot_running, init)
            return finite_or_zero(mx).reshape(C, leaf), acc.reshape(C, leaf, e)

        # the fixed reference where every row of the chunk has one (module doc), under vmap
        # for every member at once (one branch)
        return jax.lax.cond(all_at_most(sc, jnp.finfo(sc.dtype).max), fixed, running)

    ref, acc = jax.lax.map(one, (_chunks(qs, chunk), _chunks(plan.centre, chunk),
                                 _chunks(plan.lists, chunk), _chunks(plan.counts, chunk),
                                 _chunks(plan.shift, chunk)))
    return ref.reshape(nbq, leaf), acc.reshape(nbq, leaf, e)


def _backward_pass(qs, ks, vs, plan, ref, g, chunk):
    """Cotangents of (qs, ks, vs) given the sums' cotangent ``g``: a second pass over the tiles."""

    def one(carry, args):
        dk, dv = carry
        qc, cc, lc, nc, rc, gc = args

        def slot(k, state):
            dq, dk, dv = state
            j = lc[:, k]
            kt = ks[j]
            l = _tile(qc, kt, cc, plan.kvalid[j] & (k < nc)[:, None])
            w = jnp.exp(l - rc[..., None])                                # (C, i, j)
            dl = w * jnp.einsum("cie,cje->cij", gc, vs[j], precision=HIGHEST)
            dq = dq + jnp.einsum("cij,cjp->cip", dl, kt - cc[:, None, :], precision=HIGHEST)
            dk = dk.at[j].add(jnp.einsum("cij,cip->cjp", dl, qc, precision=HIGHEST))
            dv = dv.at[j].add(jnp.einsum("cij,cie->cje", w, gc, precision=HIGHEST))
            return dq, dk, dv

        dq, dk, dv = jax.lax.fori_loop(0, jnp.max(nc), slot, (jnp.zeros_like(qc), dk, dv))
        return (dk, dv), dq

    (dk, dv), dq = jax.lax.scan(
        one, (jnp.zeros_like(ks), jnp.zeros_like(vs)),
        (_chunks(qs, chunk), _chunks(plan.centre, chunk), _chunks(plan.lists, chunk),
         _chunks(plan.counts, chunk), _chunks(ref, chunk), _chunks(g, chunk)))
    return dq.reshape(qs.shape), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _sums(qs, ks, vs, plan, chunk):
    return _forward_pass(qs, ks, vs, plan, chunk)


def _sums_fwd(qs, ks, vs, plan, chunk):
    ref, acc = _forward_pass(qs, ks, vs, plan, chunk)
    return (ref, acc), (qs, ks, vs, plan, ref)


def _sums_bwd(chunk, res, cts):
    qs, ks, vs, plan, ref = res
    dq, dk, dv = _backward_pass(qs, ks, vs, plan, ref, cts[1], chunk)
    return dq, dk, dv, jax.tree.map(lambda a: None, plan)


_sums.defvjp(_sums_fwd, _sums_bwd)


# ----------------------------------------------------------------------------- the kernel


def _seed_pass(qs, ks, kvalid, centre, seed, chunk):
    """Per row: the largest centred logit ``m̃_i`` over its seed key leaf."""
    nbq, leaf, _ = qs.shape

    def one(args):
        qc, cc, sc = args
        return jnp.max(_tile(qc, ks[sc], cc, kvalid[sc]), axis=-1)

    m_row = jax.lax.map(one, (_chunks(qs, chunk), _chunks(centre, chunk), _chunks(seed, chunk)))
    return m_row.reshape(nbq, leaf)


#: the bins (one logit wide) of a leaf's histogram of candidate masses above its crude threshold
_BINS = 40


def _map_by_trips(f, xs, trips, batch):
    """``jax.lax.map(f, xs, batch_size=batch)`` over the entries in the order of ``trips``.

    A batch's loop (vectorised over its entries) runs to its longest entry's ``trips``; in
    that order a batch's entries have about the same length, and one long entry (a cluster
    whose ball spans much of the space) lengthens one batch, not all.

    Returns:
      ``f``'s results, in the entries' given order.
    """
    order = jnp.argsort(trips)
    back = jnp.argsort(order)
    out = jax.lax.map(f, jax.tree.map(lambda a: a[order], xs), batch_size=batch)
    return jax.tree.map(lambda a: a[back], out)


def _append(lists, count, keep, values, cap):
    """``values`` where ``keep`` (last axis) appended to ``lists`` after ``count`` entries.

    Entries past ``cap`` slots are dropped; the returned count still counts them.

    Returns:
      ``(lists, count)``.
    """
    pos = count[..., None] + jnp.cumsum(keep, axis=-1) - 1
    pos = jnp.where(keep & (pos < cap), pos, cap)
    at = (jnp.arange(keep.shape[0])[:, None], pos) if keep.ndim == 2 else pos
    lists = lists.at[at].set(jnp.broadcast_to(values, keep.shape), mode="drop")
    return lists, count + jnp.sum(keep, axis=-1, dtype=jnp.int32)


def _edge_pad(tree, size, empty=False):
    """``tree``'s entries (leading axis) repeated from the last up to ``size`` (``empty``: their ``count`` 0)."""
    n = jax.tree.leaves(tree)[0].shape[0]
    if size == n:
        return tree
    idx = jnp.minimum(jnp.arange(size), n - 1)
    out = jax.tree.map(lambda a: a[idx], tree)
    if empty:
        out = out._replace(count=jnp.where(jnp.arange(size) < n, out.count, 0))
    return out


def _cluster_lists(qc, kc, super_lists, super_counts, lo, eps, cap):
    """Per query cluster, the key clusters of its kept super-clusters with a bound above ``lo``.

    (A histogram of the clusters' bounded masses, the leaves' rule, kept 13 clusters a list
    on average instead of 24 at 10⁶ points, β = N, but its loop cost more than the leaves'
    loops then saved.)

    Args:
      qc: the query clusters (nc, ...).
      kc: the key clusters, padded to whole super-clusters (count 0 on the padding).
      super_lists: (nc, K) each query cluster's kept key super-clusters.
      super_counts: (nc,) their counts.
      lo: the crude level: a key below it carries at most ``budget / (2 m)``.
      eps: the dtype's machine epsilon.
      cap: slots of a list.

    Returns:
      ``(lists, counts, skipped)``: (nc, cap) key clusters, their counts (may exceed ``cap``)
      and the bounded mass of the clusters skipped inside the kept super-clusters.
    """
    arange = jnp.arange(SUPER, dtype=jnp.int32)
    dtype = kc.nu.dtype

    def one(args):
        q, sl, sn = args

        def listing(s, state):
            lists, count, skipped = state
            clusters = sl[s] * SUPER + arange
            k = jax.tree.map(lambda a: a[clusters], kc)
            b = _bounds(jax.tree.map(lambda a: a[None], q), k, eps)           # (SUPER,)
            keep = b > lo
            lists, count = _append(lists, count, keep, clusters, cap)
            mass = k.count * jnp.exp(jnp.minimum(b, 0.0))
            return lists, count, skipped + jnp.sum(jnp.where(keep, 0.0, mass))

        init = (jnp.zeros((cap,), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), dtype))
        return jax.lax.fori_loop(0, sn, listing, init)

    nc = super_lists.shape[0]
    return _map_by_trips(one, (qc, super_lists, super_counts), super_counts,
                         min(nc, SELECT_BATCH))


def _bcast(tree, axis):
    return jax.tree.map(lambda a: jnp.expand_dims(a, axis), tree)


def _crude_lists(qcv, kcv, crude, eps, capacity):
    """The two crude levels of :func:`_select`: each query cluster's key clusters above ``crude``.

    Returns:
      ``(lists, counts, overflow, skipped)``: (ncq, cap) key clusters, their counts (at most
      the slots), whether a list overflowed, and each query cluster's skipped bound.
    """
    ncq, nck = qcv.centre.shape[0], kcv.nu.shape[0]
    # super-clusters of SUPER clusters (the cluster arrays padded by repeating the last one:
    # balls that still enclose every point; the padded key clusters hold no key)
    nsq, nsk = -(-ncq // SUPER), -(-nck // SUPER)
    qsv = _query_clusters(_edge_pad(qcv, nsq * SUPER), SUPER)
    kcv_pad = _edge_pad(kcv, nsk * SUPER, empty=True)
    ksv = _key_clusters(kcv_pad, SUPER)
    bs = _bounds(_bcast(qsv, 1), _bcast(ksv, 0), eps)                    # (nsq, nsk)
    keep_s = bs > crude
    skipped_s = jnp.sum(jnp.where(keep_s, 0.0, ksv.count * jnp.exp(jnp.minimum(bs, 0.0))),
                        axis=1)
    idx_s, count_s = pack_lists(keep_s, jnp.broadcast_to(jnp.arange(nsk, dtype=jnp.int32),
                                                         bs.shape), nsk)
    per = jnp.arange(ncq) // SUPER                     # each query cluster's super-cluster
    cap_c = min(nck, max(CAPACITY, capacity))
    idx_c, count_c, skipped_m = _cluster_lists(qcv, kcv_pad, idx_s[per], count_s[per], crude,
                                               eps, cap_c)
    overflow_c = jnp.max(count_c) > cap_c
    count_c = jnp.minimum(count_c, cap_c)
    return idx_c, count_c, overflow_c, skipped_s[per] + skipped_m


def _leaf_bounds(q, kc, s, *, kv, eps, group, arange):
    """The key leaves of entry ``s`` of the cluster list ``kc`` against the query leaves ``q``.

    Returns:
      ``(leaves, bounds, masses)``: the key leaves (group,), their bounds (group, group) and
      bounded masses.
    """
    leaves = (kc[s] * group + arange).astype(jnp.int32)
    k = jax.tree.map(lambda a: a[leaves], kv)
    b = _bounds(_bcast(q, 1), _bcast(k, 0), eps)                       # (G, G)
    return leaves, b, k.count * jnp.exp(jnp.minimum(b, 0.0))


def _leaf_threshold(args, *, bounds_of, budget, m, arange, dtype):
    """A query cluster's leaves' listing thresholds, from a histogram of their bounded masses.

    Returns:
      ``(threshold, above)``: per leaf, the bound above which it lists, and how many key
      leaves lie in the bins from there up (at least as many as it lists).
    """
    q, kc, nc, sc = args                   # q: the cluster's leaves (group, ...)
    group = arange.shape[0]
    left = budget - sc
    lo = jnp.log(left / m)                 # every key below it: at most ``left`` in all

    def histogram(s, state):
        hist, number = state
        _, b, mass = bounds_of(q, kc, s)
        bins = jnp.clip(jnp.floor(b - lo), 0, _BINS).astype(jnp.int32)
        return (hist.at[arange[:, None], bins].add(mass),
                number.at[arange[:, None], bins].add(1))

    hist, number = jax.lax.fori_loop(
        0, nc, histogram, (jnp.zeros((group, _BINS + 1), dtype),
                           jnp.zeros((group, _BINS + 1), jnp.int32)))
    # skip the bins 0 … k−1 (bounds below lo + k) for the largest k that fits
    k = jnp.sum(jnp.cumsum(hist[:, :_BINS], axis=1) <= left, axis=1)
    # the leaves of bins k and up: at least as many as the listing keeps
    above = jnp.sum(jnp.where(jnp.arange(_BINS + 1) >= k[:, None], number, 0), axis=1)
    return lo + k, above


def _leaf_lists(cap, *, qg, idx_c, count_c, tau, bounds_of, capacity, dtype, batch):
    """Every query leaf's key leaves above its threshold ``tau``, in ``cap`` slots padded to ``capacity``.

    Returns:
      ``(lists, counts, skipped, top)``: (nbq, capacity) key leaves; per query cluster and
      leaf, the counts (may exceed ``cap``), the skipped bounds and the largest kept bounds.
    """
    ncq, group = tau.shape

    def per_cluster(args):
        q, kc, nc, t = args

        def listing(s, state):
            lists, count, skipped, top = state
            leaves, b, mass = bounds_of(q, kc, s)
            keep = b > t[:, None]
            lists, count = _append(lists, count, keep, leaves, cap)
            return (lists, count, skipped + jnp.sum(jnp.where(keep, 0.0, mass), axis=1),
                    jnp.maximum(top, jnp.max(jnp.where(keep, b, -jnp.inf), axis=1)))

        init = (jnp.zeros((group, cap), jnp.int32), jnp.zeros((group,), jnp.int32),
                jnp.zeros((group,), dtype), jnp.full((group,), -jnp.inf, dtype))
        return jax.lax.fori_loop(0, nc, listing, init)

    lists, count_f, skipped_f, top = _map_by_trips(per_cluster, (qg, idx_c, count_c, tau),
                                                   count_c, batch)
    lists = lists.reshape(ncq * group, cap)
    return jnp.pad(lists, ((0, 0), (0, capacity - cap))), count_f, skipped_f, top


def _select(qv, kv, qcv, kcv, budget, eps, group, capacity, chunk):
    """Every query leaf's list of key leaves, with the bounds of what it skips.

    ``budget`` bounds every row's skipped mass relative to ``e^{m̃_i}``. Two crude levels
    skip the key super-clusters (``SUPER`` clusters), then the key clusters inside the kept
    ones, whose every key is below ``budget / (2 m)`` (at most half the budget in all: a key
    is skipped at one level). Each leaf then visits the leaves of its kept clusters twice, in
    loops as long as its cluster's list: once for a histogram of their bounded masses (bins
    one logit wide), from which it takes the largest threshold whose skipped masses fit what
    is left of the budget, once to list the leaves above it.

    Args:
      qv: query leaves.
      kv: key leaves.
      qcv: query clusters.
      kcv: key clusters.
      budget: the skipped mass allowed a row, relative to ``e^{m̃_i}``.
      eps: the dtype's machine epsilon.
      group: leaves a cluster.
      capacity: slots of a list.
      chunk: query leaves a batch.

    Returns:
      ``(lists, counts, top, skipped, overflow, kept)``: (nbq, capacity) key leaves, their
      counts, the largest kept bound and the skipped bound of each leaf, whether a list
      overflowed, and the longest lists of key clusters and of key leaves.
    """
    ncq = qcv.centre.shape[0]
    m = jnp.sum(kcv.count)
    crude = jnp.log(0.5 * budget / m)
    idx_c, count_c, overflow_c, skipped_c = _crude_lists(qcv, kcv, crude, eps, capacity)
    arange = jnp.arange(group, dtype=jnp.int32)
    bounds_of = functools.partial(_leaf_bounds, kv=kv, eps=eps, group=group, arange=arange)
    dtype = kcv.nu.dtype
    qg = jax.tree.map(lambda a: a.reshape((ncq, group) + a.shape[1:]), qv)
    batch = min(ncq, SELECT_BATCH)
    tau, above = _map_by_trips(
        functools.partial(_leaf_threshold, bounds_of=bounds_of, budget=budget, m=m,
                          arange=arange, dtype=dtype),
        (qg, idx_c, count_c, skipped_c), count_c, batch)
    listed = functools.partial(_leaf_lists, qg=qg, idx_c=idx_c, count_c=count_c, tau=tau,
                               bounds_of=bounds_of, capacity=capacity, dtype=dtype, batch=batch)
    # lists of ``CAPACITY`` slots where every list fits (the loops carry the lists: their
    # cost grows with the slots), else of ``capacity``
    short = min(capacity, CAPACITY)
    if short < capacity:
        lists, count_f, skipped_f, top = jax.lax.cond(
            all_at_most(above, short), lambda: listed(short), lambda: listed(capacity))
    else:
        lists, count_f, skipped_f, top = listed(capacity)
    count_f = count_f.reshape(-1)
    overflow = (jnp.max(count_f) > capacity) | overflow_c
    return (lists, jnp.minimum(count_f, capacity),
            top.reshape(-1), skipped_f.reshape(-1) + jnp.repeat(skipped_c, group), overflow,
            jnp.stack([jnp.max(count_c), jnp.max(count_f)]))


def local_attention(q, k, v, *, qpos=None, kpos=None, tol=DEFAULT_TOL, leaf=LEAF, group=None,
                    capacity=None, self_keys=False, on_overflow="blocked", fallback=None,
                    max_visited=None):
    """``Σ_j w_ij v_j`` with ``w_ij ∝ exp(q_i · k_j)``, skipping key blocks below the tolerance.

    Args:
      q: (n, p) queries (pre-scaled: the logits are ``q_i · k_j``).
      k: (m, p) keys.
      v: (m, e) values.
      qpos: (n, r) positions that order the queries (None: ``q``); ignored with ``self_keys``.
      kpos: (m, r) positions that order the keys (None: ``k``; other positions need
        ``self_keys``).
      tol: the certified bound of ``|m_i − m_i^dense| / max_j |v_j|`` (module doc).
      leaf: points per leaf.
      group: leaves per coarse cluster (None: :func:`default_group`).
      capacity: key leaves a query leaf's list holds; None: a quarter of the key leaves, at
        least ``CAPACITY``, at most ``LIST_ENTRIES`` entries in all (every leaf when there are
        fewer).
      self_keys: the queries are the keys' own points (``qpos = kpos``): one ordering.
      on_overflow: ``"blocked"`` (call ``fallback``) or ``"nan"``.
      fallback: zero-argument function returning the (n, e) dense answer, for
        ``on_overflow="blocked"`` (None: the overflow is reported in the stats alone).
      max_visited: with a ``fallback``, take it also where the lists would visit more than
        this fraction of the pairs (``kernel="auto"``); ``visited`` then still reports the
        lists' fraction. With ``max_visited``, where ``2 max_i |q_i| max_j |k_j − k̄|`` (a
        bound of every row's logit spread) is below ``log(2 / tol)``, nothing can be skipped
        and the fallback answers before the points are ordered (``visited`` 1).

    Returns:
      ``(out, stats)``: (n, e) averages and :class:`LocalStats`.

    Raises:
      ValueError: keys ordered by other positions without ``self_keys``.
    """
    if not self_keys and not (kpos is None or kpos is k):
        # a query leaf seeds its row maxima from the key leaf at its place on the keys' curve
        raise ValueError("local_attention: keys ordered by other positions (kpos) need "
                         "self_keys=True (each query leaf then seeds from its own keys)")
    kw = dict(qpos=qpos, kpos=kpos, tol=tol, leaf=leaf, group=group, capacity=capacity,
              self_keys=self_keys, on_overflow=on_overflow, fallback=fallback,
              max_visited=max_visited)
    if fallback is None or max_visited is None:
        return _listed_attention(q, k, v, **kw)
    # ``kernel="auto"``: where no row's logits can spread over log(2/tol), no key can be
    # skipped (a skipped key weighs at most tol/2 of the row's largest weight): the blocked
    # kernel answers at the cost of two norms, without ordering the points
    n, m = q.shape[0], k.shape[0]
    radius = jnp.max(jnp.linalg.norm(k - jnp.mean(k, axis=0), axis=-1))
    spread = 2.0 * jnp.max(jnp.linalg.norm(q, axis=-1)) * radius
    g = group or default_group(m, leaf)
    leaves = _padded(m, leaf, g) // leaf       # every cluster and leaf would be kept
    every = LocalStats(jnp.zeros((n,), q.dtype), jnp.zeros((n,), q.dtype), jnp.ones((), q.dtype),
                       jnp.ones((), q.dtype), jnp.zeros((), bool),
                       jnp.array([leaves // g, leaves], jnp.int32), jnp.ones((), bool))
    return jax.lax.cond(
        all_at_most(jnp.nan_to_num(spread, nan=jnp.inf), math.log(2.0 / tol)),
        lambda: (fallback().astype(q.dtype), every),
        lambda: _listed_attention(q, k, v, **kw))


def _seeded_leaves(sq, sk, kvalid, qvalid, codes, locate, chunk, *, self_keys,
                   keys_are_positions):
    """The key and query leaves, with each query leaf's centre and row maxima from its seeds.

    The seed leaves of a query leaf (its rows' largest logits over them bound the rows'
    maxima from below): the key leaf at the place, in the key order (curve ``codes``), of
    the direction q̂ of its first query (where its logits peak, when the keys are their own
    positions), and under self-attention its own.

    Returns:
      ``(kv, qv, centre, m_row)``: the key leaves, the query leaves, (nbq, p) centres (the
      first seed's ball centre) and (nbq, leaf) lower bounds of the row maxima.
    """
    nbq, leaf, _ = sq.shape
    nbk = sk.shape[0]
    seeds = []
    if self_keys:
        seeds.append(jnp.arange(nbq))
    if keys_are_positions:
        first = sq[:, 0, :]
        rho1 = jnp.linalg.norm(first, axis=-1, keepdims=True)
        at = jnp.searchsorted(codes, locate(first / jnp.where(rho1 > 0, rho1, 1.0)))
        seeds.append(jnp.minimum(at, nbk * leaf - 1) // leaf)
    kv = _key_leaves(sk, kvalid)
    centre = kv.ball.centre[seeds[0]]
    m_row = _seed_pass(sq, sk, kvalid, centre, seeds[0], chunk)
    for seed in seeds[1:]:
        m_row = jnp.maximum(m_row, _seed_pass(sq, sk, kvalid, centre, seed, chunk))
    # e_i = max_j (|k_j|² − |q̂_i − k_j|²) = 2 max_j q̂_i·k_j − |q̂_i|² over the seed leaf
    rho = jnp.linalg.norm(sq, axis=-1)
    safe = jnp.where(rho > 0, rho, 1.0)
    e_row = jnp.where(rho > 0, 2.0 * (m_row + jnp.sum(sq * centre[:, None, :], -1)) / safe
                      - jnp.sum((sq / safe[..., None]) ** 2, -1), 0.0)
    return kv, _query_leaves(sq, centre, m_row, e_row, qvalid), centre, m_row


def _listed_attention(q, k, v, *, qpos, kpos, tol, leaf, group, capacity, self_keys,
                      on_overflow, fallback, max_visited):
    """:func:`local_attention` after ``kernel="auto"``'s early answer: order, list, tiles."""
    n, p = q.shape
    m, e = v.shape
    dtype = q.dtype
    eps = float(jnp.finfo(dtype).eps)
    keys_are_positions = kpos is None or kpos is k
    kpos = k if kpos is None else kpos
    ox, oy, locate = spatial_order(kpos if self_keys else (q if qpos is None else qpos),
                                   None if self_keys else kpos, leaf=leaf, group=group)
    g = group or default_group(m, leaf)
    nbq, nbk = ox.perm.shape[0] // leaf, oy.perm.shape[0] // leaf
    if capacity is None:
        capacity = max(CAPACITY, min(-(-nbk // 4), LIST_ENTRIES // nbq))
    capacity = min(int(capacity), nbk)
    qs = q[ox.perm].reshape(nbq, leaf, p)
    ks = k[oy.perm].reshape(nbk, leaf, p)
    ones = jnp.ones((m, 1), v.dtype)
    vs = jnp.where(oy.valid[:, None], jnp.concatenate([v, ones], axis=1)[oy.perm], 0)
    vs = vs.reshape(nbk, leaf, e + 1).astype(dtype)
    kvalid = oy.valid.reshape(nbk, leaf)
    qvalid = ox.valid.reshape(nbq, leaf)
    sq = jax.lax.stop_gradient(qs)
    sk = jax.lax.stop_gradient(ks)
    chunk = min(CHUNK, nbq)
    kv, qv, centre, m_row = _seeded_leaves(sq, sk, kvalid, qvalid, oy.codes, locate, chunk,
                                           self_keys=self_keys,
                                           keys_are_positions=keys_are_positions)
    lists, counts, top, skipped, overflow, kept = _select(
        qv, kv, _query_clusters(qv, g), _key_clusters(kv, g), 0.5 * tol, eps, g, capacity, chunk)
    # a fixed reference m̃_i + (largest kept bound) where that keeps every weight a normal
    # number: no running maximum, one pass a tile
    shift = jnp.where(top <= _SAFE.get(jnp.dtype(dtype).name, 60.0) / 2,
                      jnp.maximum(top, 0.0), jnp.inf)[:, None] + m_row
    # rows of padding: nothing to visit, a unit normaliser (their results are dropped)
    shift = jnp.where(qvalid, shift, 0.0)
    counts = jnp.where(jnp.any(qvalid, axis=1), counts, 0)
    # pairs of the listed tiles, padding excluded
    listed = jnp.sum(jnp.where(jnp.arange(lists.shape[1]) < counts[:, None], kv.count[lists], 0),
                     axis=1)
    visited = jnp.sum(listed * jnp.sum(qvalid, axis=1)) / (float(n) * float(m))
    place = jnp.where(ox.valid, ox.perm, n)

    def run():
        # query leaves by list length, so that a chunk's loop runs to about its own lists' end
        by_len = jnp.argsort(counts)
        back = jnp.argsort(by_len)
        plan = _Plan(kvalid, centre[by_len], lists[by_len], counts[by_len], shift[by_len])
        ref, acc = _sums(qs[by_len], ks, vs, plan, chunk)
        ref, acc = ref[back], jnp.where(qvalid[..., None], acc[back], 1.0)
        # back to the caller's order (the padding's places dropped)
        out = ratio(acc[..., :e], acc[..., e:]).reshape(nbq * leaf, e)
        out = jnp.zeros((n, e), out.dtype).at[place].set(out, mode="drop", unique_indices=True)
        # the realised bound: the skipped bound relative to e^{m̃_i}, over the kept mass
        den = jax.lax.stop_gradient(acc[..., e])
        mass = skipped[:, None] * jnp.exp(m_row - jax.lax.stop_gradient(ref)) / den
        mass = jnp.zeros((n,), dtype).at[place].set(mass.reshape(-1), mode="drop",
                                                     unique_indices=True)
        return out, mass

    if on_overflow == "nan":
        out, mass = run()
        bad = jnp.where(overflow, jnp.nan, 0.0).astype(dtype)
        out, mass = out + bad, mass + bad
    elif fallback is None:
        out, mass = run()
    else:
        # the dense answer where a list overflowed or the lists would visit more than
        # ``max_visited`` of the pairs (one branch under vmap: for every member or none)
        go = jnp.where(overflow, 2.0, visited / (1.0 if max_visited is None else max_visited))
        ok = all_at_most(go, 1.0)
        out, mass = jax.lax.cond(ok, run,
                                 lambda: (fallback().astype(dtype), jnp.zeros((n,), dtype)))
        return out, LocalStats(mass, 2.0 * mass, jnp.where(ok, visited, 1.0), visited,
                               overflow, kept, ~ok)
    return out, LocalStats(mass, 2.0 * mass, visited, visited, overflow, kept,
                           jnp.zeros((), bool))
