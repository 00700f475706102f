r"""Leaves of a point cloud for the block-sparse kernels: k-d ordering, bounding balls, lists.

Shared by the block-sparse kernels (the local attention core, :mod:`._local`, and the
multiscale W2 solver, :mod:`jaxdyn.distances._multiscale`):

- :func:`kd_order`: points in the order of a k-d tree of recursive median splits (each
  node cut on its widest coordinate after a whole number of runs of the largest ``unit``
  below its size, or at a wide gap of its middle half, so that separated clusters never
  share a leaf), with the leaf of each place. Jittable; O(N log N) a level. In a bounding
  box the leaves are tighter than a space-filling curve's: on a 3-d Gaussian cloud of 10⁵
  points in leaves of 32, mean radius 0.17 (k-d) against 0.29 (Morton curve of the box),
  mean squared radius 0.047 against 0.146.
- :func:`balls`: centre (mean of the valid rows) and radius (largest distance to it) of
  each leaf; without a mask, those of every row.
- :func:`pack_lists`: the fixed-capacity list builder of both kernels (kept entries packed
  in order; the counts report an overflow, never a silent truncation);
  :func:`block_lists`: the kept blocks of each row so packed, optionally best first,
  padded with an empty block's index.
- :func:`list_length` (with :func:`bucket`, :func:`pow2_bucket`), :func:`on_lists`,
  :func:`neighbours`, :func:`scatter_lists`, :func:`list_density`: the host side of lists
  chosen from a keep mask (a common length from a few buckets, so that successive calls
  share one program; the lists packed inside the program that takes them).
- :func:`by_length` and :func:`unsort`: the rows of a batched loop with per-row trip
  counts taken in the order of their list lengths (a batch then runs to about its own
  lists' end), and the results put back.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["GAP_FACTOR", "Balls", "KdOrder", "balls", "block_lists", "bucket", "by_length",
           "kd_order", "kd_size", "list_density", "list_length", "neighbours", "on_lists",
           "pack_lists", "pow2_bucket", "scatter_lists", "unsort"]

#: a node above the largest unit is cut at the widest gap of the middle half of its sorted
#: coordinate when that gap exceeds ``GAP_FACTOR + log h`` times the mean of those h spacings
#: (the largest of h spacings of a smooth density is about ``log h`` times their mean).
GAP_FACTOR = 8.0


class KdOrder(NamedTuple):
    """Points in k-d tree order.

    Attributes:
      perm: (n,) int32, the point at each place (the places at or past ``count`` hold the
        padding rows, in their order).
      leaf: (n,) int32, the leaf (node of at most ``units[0]`` points) of each place,
        numbered along the order; -1 on the padding.
      rank: (n,) int32, each place's rank in its leaf.
      n_leaves: int32 scalar, the number of leaves.
    """

    perm: jax.Array
    leaf: jax.Array
    rank: jax.Array
    n_leaves: jax.Array


def kd_size(n: int) -> int:
    """The padded length of a cloud of ``n`` points for :func:`kd_order`.

    Eight lengths an octave (at most 1/8 more rows, at least 256): clouds of nearby sizes
    share one program.

    Args:
      n: number of points.

    Returns:
      The padded length.
    """
    if n <= 256:
        return 256
    step = 2 ** (int(math.floor(math.log2(n))) - 3)
    return -(-n // step) * step


@functools.partial(jax.jit, static_argnames=("units", "gaps"))
def kd_order(points, count=None, *, units, gaps=True) -> KdOrder:
    """The places of ``points`` along a k-d tree whose leaves hold at most ``units[0]`` points.

    Every node of more than ``min(units)`` points is sorted on its widest coordinate and cut
    after ``⌈⌈n / u⌉ / 2⌉ · u`` of its n points, u the largest unit below n (so the leaves are
    full but for one a subtree, and inside a leaf the runs of each smaller unit are compact
    too); with ``gaps``, a node of more than ``units[0]`` points is cut at the widest gap of
    the middle half of its coordinate instead when that gap exceeds ``GAP_FACTOR + log h``
    times the mean of those h spacings. Ties keep the previous order. Level by level: one
    sort of all the points (by node, then coordinate) and segment reductions a level.

    Args:
      points: (n, d) positions (no derivative flows through the order).
      count: the number of points (traced); the rows from ``count`` on are padding, kept at
        the end in their order. None: all n.
      units: run sizes, the leaf size first (e.g. ``(leaf,)``, ``(32, 4)``).
      gaps: cut separated clusters apart at the nodes above the leaf size.

    Returns:
      :class:`KdOrder`.
    """
    units = tuple(sorted({int(u) for u in units}, reverse=True))
    pts = jax.lax.stop_gradient(points)
    n, d = pts.shape
    place = jnp.arange(n, dtype=jnp.int32)
    count = jnp.asarray(n if count is None else count, jnp.int32)
    real = place < count
    inf = jnp.asarray(jnp.inf, pts.dtype)

    def segment(op, a, key):
        return op(a, key, num_segments=n, indices_are_sorted=True)

    def cut_of(key, v, size, r):
        """Where each node is cut (its size where it is not)."""
        u = jnp.zeros_like(size)
        for unit in units[::-1]:  # the largest unit below the node's size
            u = jnp.where(size > unit, unit, u)
        split = (u > 0) & real
        u1 = jnp.maximum(u, 1)
        cut = jnp.where(split, (size + u1 - 1) // u1 // 2 * u1, size)
        if gaps:
            lo, hi = size // 4, (3 * size) // 4
            h = hi - lo
            inside = (r >= lo) & (r < hi)
            gap = jnp.where(inside, jnp.concatenate([v[1:], v[-1:]]) - v, -inf)
            gmax = segment(jax.ops.segment_max, gap, key)[key]
            k = segment(jax.ops.segment_min, jnp.where(inside & (gap == gmax), r, n), key)[key]
            v_lo, v_hi = v[key + lo], v[jnp.minimum(key + hi, n - 1)]
            hf = jnp.maximum(h, 1).astype(pts.dtype)
            wide = ((size > units[0]) & split & (h > 0) & (v_hi > v_lo)
                    & (gmax > (GAP_FACTOR + jnp.log(hf)) * (v_hi - v_lo) / hf))
            cut = jnp.where(wide, k + 1, cut)  # k: the rank before the gap
        return split, cut

    def body(state):
        perm, key, leaf_key, _ = state
        size = segment(jax.ops.segment_sum, jnp.ones((n,), jnp.int32), key)[key]
        leaf_key = jnp.where((leaf_key < 0) & (size <= units[0]) & real, key, leaf_key)
        p = pts[perm]
        box = (segment(jax.ops.segment_max, p, key) - segment(jax.ops.segment_min, p, key))[key]
        axis = jnp.argmax(box, axis=1)
        v = jnp.take_along_axis(p, axis[:, None], axis=1)[:, 0]
        # the nodes that are not cut keep their order (and the padding its place)
        v = jnp.where(real & (size > units[-1]), v, 0.0)
        key, v, perm = jax.lax.sort((key, v, perm), num_keys=2, is_stable=True)
        split, cut = cut_of(key, v, size, place - key)
        new = jnp.where(split & (place - key >= cut), key + cut, key)
        return perm, new, leaf_key, jnp.any(split)

    init = (place, jnp.where(real, 0, count), jnp.full((n,), -1, jnp.int32), jnp.asarray(True))
    perm, _, leaf_key, _ = jax.lax.while_loop(lambda s: s[3], body, init)
    start = real & (leaf_key == place)
    index = jnp.cumsum(start.astype(jnp.int32)) - 1
    safe = jnp.maximum(leaf_key, 0)
    leaf = jnp.where(real, index[safe], -1)
    return KdOrder(perm, leaf, jnp.where(real, place - safe, 0),
                   jnp.sum(start.astype(jnp.int32)))


class Balls(NamedTuple):
    """Bounding balls of the leaves of a sorted cloud.

    Attributes:
      centre: (nb, p) the mean of each leaf's valid points.
      radius: (nb,) the largest distance of a valid point to it (0 for a leaf of padding).
    """

    centre: jax.Array
    radius: jax.Array


def balls(pts, valid=None) -> Balls:
    """Centre (mean) and radius (largest distance to it) of each leaf over its valid rows.

    Args:
      pts: (nb, leaf, p) the leaves' points.
      valid: (nb, leaf) bool, False on padding rows (excluded); None: every row counts.

    Returns:
      :class:`Balls` (a leaf of padding alone: centre 0, radius 0).
    """
    if valid is None:
        c = jnp.mean(pts, axis=1)
        r2 = jnp.max(jnp.sum((pts - c[:, None, :]) ** 2, axis=-1), axis=1)
        return Balls(c, jnp.sqrt(r2))
    w = valid.astype(pts.dtype)
    c = (jnp.sum(pts * w[..., None], axis=1)
         / jnp.maximum(jnp.sum(w, axis=1), 1.0)[:, None])
    d2 = jnp.sum((pts - c[:, None, :]) ** 2, axis=-1)
    return Balls(c, jnp.sqrt(jnp.max(jnp.where(valid, d2, 0.0), axis=1)))


def pack_lists(keep, values, cap):
    """The ``values`` where ``keep`` (along the last axis), packed in order into ``cap`` slots.

    A fixed-capacity list per row (no sort): the kept entries beyond ``cap`` are dropped, and
    the caller compares the counts with ``cap`` to detect it.

    Args:
      keep: (rows, c) booleans.
      values: (rows, c) the entries.
      cap: slots a row.

    Returns:
      ``(lists, counts)``: (rows, cap) packed values (the free slots hold the row's first
      value) and (rows,) the number of kept entries (may exceed ``cap``).
    """
    pos = jnp.cumsum(keep, axis=-1, dtype=jnp.int32) - 1
    slot = jnp.where(keep & (pos < cap), pos, cap)
    rows = jnp.arange(keep.shape[0])[:, None]
    fill = jnp.broadcast_to(values[..., :1], keep.shape[:-1] + (cap,))
    packed = fill.at[rows, slot].set(values, mode="drop")
    return packed, jnp.sum(keep, axis=-1, dtype=jnp.int32)



def block_lists(keep, cap, key=None, best=None):
    """The kept blocks of each row (``keep`` (rows, nb)) in ``cap`` slots, padded with ``nb``.

    Packed by :func:`pack_lists` (in block order); with ``key`` (rows, nb), the
    ``best`` entries of largest key first, in that order (ties in block order), the others
    after them in block order (``best`` None: the whole list sorted). The free slots hold
    ``nb``: the index of an empty block that the kernels append. Lists longer than ``cap``
    are cut (the caller compares the counts with ``cap``).

    Args:
      keep: (rows, nb) bool.
      cap: slots a row.
      key: None, or (rows, nb) the order of each list.
      best: how many entries of each list ``key`` puts first (None: all of them). A sort of
        the whole lists costs O(cap log cap) a row; the first few by ``lax.top_k`` and a
        scatter, O(cap).

    Returns:
      ``(lists, counts)``: (rows, cap) int32 block indices and (rows,) the kept counts.
    """
    rows, nb = keep.shape
    lists, counts = pack_lists(keep, jnp.broadcast_to(jnp.arange(nb, dtype=jnp.int32), keep.shape),
                               cap)
    used = jnp.arange(cap)[None, :] < counts[:, None]
    lists = jnp.where(used, lists, nb)
    if key is None:
        return lists, counts
    score = jnp.where(used, jnp.take_along_axis(key, jnp.minimum(lists, nb - 1), axis=1),
                      -jnp.inf)
    if best is None or best >= cap:
        return jnp.take_along_axis(lists, jnp.argsort(-score, axis=1, stable=True), axis=1), counts
    _, top = jax.lax.top_k(score, best)  # the places of the best entries, best first
    r = jnp.arange(rows)[:, None]
    first = jnp.zeros((rows, cap), bool).at[r, top].set(True)
    # the others keep their order after the first ones
    place = jnp.where(first, 0, best + jnp.cumsum(~first, axis=1, dtype=jnp.int32) - 1)
    place = place.at[r, top].set(jnp.arange(best, dtype=jnp.int32)[None, :])
    return jnp.zeros_like(lists).at[r, place].set(lists, unique_indices=True), counts


def by_length(counts, chunk: int = 1):
    """The rows in the order of their step counts ``⌈counts / chunk⌉`` (stable).

    A batched (vmapped) loop with per-row trip counts runs each batch to its longest list:
    in this order a batch holds lists of about one length.

    Args:
      counts: (rows,) list lengths.
      chunk: list entries a step.

    Returns:
      The permutation (rows,).
    """
    return jnp.argsort((counts + chunk - 1) // chunk, stable=True)


def unsort(out, order):
    """``out`` (rows taken in ``order``) back in the original order.

    Args:
      out: (rows, ...) results in the order ``order``.
      order: (rows,) the permutation they were taken in.

    Returns:
      The rows in the original order.
    """
    return jnp.zeros_like(out).at[order].set(out, unique_indices=True)


# --------------------------------------------------------------- host-side list lengths


def bucket(k: int, multiple: int) -> int:
    """The least of ``multiple · 2^j`` and ``multiple · 1.5 · 2^j`` that is at least ``k``.

    (Multiples of ``multiple``.) The lists of successive rounds share a few lengths, so a
    round is compiled a few times only (a row block's loop stops at its own list: the
    padding costs no kernel work).

    Returns:
        The bucket length.
    """
    b = multiple
    while True:
        for c in (b, b * 3 // 2):
            if c >= k and c % multiple == 0:
                return c
        b *= 2


def pow2_bucket(k: int, multiple: int = 8) -> int:
    """The least ``multiple · 2^j`` that is at least ``k``."""
    b = multiple
    while b < k:
        b *= 2
    return b


@functools.partial(jax.jit, static_argnames=("fn", "cap", "block", "best"))
def on_lists(fn, args, keep, key=None, *, cap, block=None, best=None):
    """``fn(*args, lists, block=block)`` on the lists of ``keep``, lists and all as one program.

    ``keep`` (nq, nk), or a tuple of such masks (kernels whose lists share the length
    ``cap``); the lists by :func:`block_lists` (the ``best`` of largest
    ``key`` first when it is given), padded with the empty block ``nk``.

    Returns:
        (the lists (a tuple for a tuple of masks), ``fn``'s result, or None without ``fn``).
    """
    parts = len(keep) if isinstance(keep, tuple) else 0
    keep = jnp.concatenate(keep) if parts else keep
    lists = block_lists(keep, cap, key, best)[0]
    out = None if fn is None else fn(*args, lists, block=block)
    return (tuple(jnp.split(lists, parts)) if parts else lists), out


def list_length(keep: np.ndarray, multiple: int = 8, width: int = 0, pow2: bool = False) -> int:
    """The common length K of the lists of ``keep`` (nq, nk).

    A multiple of ``multiple`` (:func:`._sparse.listed_lse` gathers 8 blocks a step): the
    :func:`bucket` (``pow2``: the :func:`pow2_bucket`, or ``nk`` rounded up once that is at most
    twice as long) of the longest list, at least ``width`` (lists that one program takes
    together share a length: one compilation), at most ``nk`` rounded up.

    Returns:
        K.
    """
    nk = keep.shape[-1]
    need = max(multiple, -(-int(keep.sum(-1).max(initial=0)) // multiple) * multiple)
    full = max(multiple, -(-nk // multiple) * multiple)
    k = max(pow2_bucket(need, multiple) if pow2 else bucket(need, multiple), width)
    return full if (pow2 and 2 * k >= full) or k > full else k


def neighbours(keep: np.ndarray, order_key: np.ndarray, multiple: int = 8,
                width: int = 0, pow2: bool = False) -> np.ndarray:
    """The kept block indices per row block, best first, padded with ``nk`` (the empty block) to :func:`list_length`.

    Returns:
        (nq, K) int32 block indices.
    """
    k = list_length(keep, multiple, width, pow2)
    return np.asarray(on_lists(None, (), jnp.asarray(keep), jnp.asarray(order_key), cap=k)[0])


def scatter_lists(cand: np.ndarray, vals: np.ndarray, nk: int) -> np.ndarray:
    """(nq, nk) array holding ``vals`` (nq, K) at the blocks ``cand`` lists, -inf elsewhere."""
    full = np.full((cand.shape[0], nk + 1), -np.inf, vals.dtype)
    np.put_along_axis(full, cand, vals, axis=1)
    return full[:, :nk]


def list_density(nbr: np.ndarray, nk: int) -> float:
    """Fraction of the key blocks visited (1 = a dense pass)."""
    return float(np.mean(np.sum(nbr < nk, axis=1)) / nk)
