"""The online softmax / log-sum-exp core that every blocked kernel of this package runs on.

For query rows ``q_i`` and keys ``k_j`` with values ``v_j`` (m, e), every blocked kernel
computes, one (query block × key block) tile of logits ``l_ij`` at a time, the sums

    A_i = Σ_j e^{l_ij − ref_i} [v_j, 1],    m_i = A_i[:e] / A_i[e],    lse_i = ref_i + log A_i[e]

(the attention average, its normaliser and the row's log-sum-exp), never forming the N × M
logits: memory O(q_block · k_block). The logits are ``l_ij = ⟨q_i, k_j⟩ + b_j − α |i − j|``
(an optional per-key bias ``b``, an optional ALiBi slope ``α``), ``−∞`` where ``j > i``
under a causal mask. The reference ``ref_i`` is one of:

* **a fixed shift** ``r_i ≥ max_j l_ij`` (``"bound"``): one pass over each tile, no maximum,
  no rescaling. The shift cancels in ``m_i`` and in ``lse_i``; it never overflows. It could
  underflow: the row's largest weight is at least ``e^{low_i − r_i}`` for any known logit
  ``low_i`` of row i, so a query block takes the shift only while every ``r_i − low_i <=
  SAFE_SHIFT`` (the largest weight stays a normal number) and the running maximum otherwise.
  Under a causal mask the maxima in ``r_i`` run over j ≤ i and each row takes its own
  choice, so that row i depends on the rows and keys j ≤ i only, to the last bit.
  ``r_i`` is the Cauchy–Schwarz bound ``|q_i| max_j |k_j| + max_j b_j`` (optionally the
  smaller of it and an AM–GM bound, tight for L2 logits); ``low_i`` the diagonal logit
  ``l_ii`` where the caller knows it is a logit of the row (self-attention: it is never
  masked by a causal mask) or else the maximum of the row's first key block (key 0 is never
  masked). With ``r = 0`` (``"zero"``) the sums are plain exponentials: unnormalised weights.
* **the running maximum** (``"running"``; Rabe & Staats 2021, the flash-attention
  recurrence): per key block ``M ← max(M, max_j l_ij)``, ``A ← A e^{M_old − M} + Σ_j
  e^{l_ij − M} [v_j, 1]``, with ``M = −∞`` (a row that has seen only masked logits so far)
  read as 0. ``"hardmax"`` keeps the arg-max set instead (ties share the weight).

The reference carries no derivative (it cancels in ``m_i`` and ``lse_i``), and the quotient
``m_i`` is :func:`ratio`, whose derivative never squares the normaliser (which can be as small
as e^-60 under the bound shift). :func:`sums` is the entry point of every kernel: the sums
with a derivative that is a second blocked pass over the same tiles (``jax.custom_jvp``; its
tile step rematerialised, so that reverse mode, the transpose of that pass, stores the inputs
and the references, never a tile: the flash-attention backward pass, one core for
:func:`~jaxdyn.kernels.interaction`, :func:`~jaxdyn.kernels.heads_interaction` and
:func:`~jaxdyn.kernels.attend`).

A tile's logits are formed in one of three ways, picked by the caller per platform:
``"dot"`` (a matrix product, the exponential in its own loop, the weighted sums a product;
``logits="fused"`` forms them instead inside the exponential's loop on a (keys × queries)
tile, each key's coordinates loop-invariant scalars: the tile is written once and read once)
and ``"fused"`` (accelerators: broadcast multiply-adds and sibling reductions, which XLA:GPU
fuses into kernels that never write the tile to memory). Padded keys (m not a multiple of the
block) repeat key 0 (its bias and position too) and carry the value ``[0, 0]``: they never
raise a maximum or a bound and add nothing. Padded queries repeat the last query (and its
position). Under a causal mask a query block skips every key block wholly after its last
query: the CPU tiles' fixed-shift pass in loops whose trip counts are the block's own, the
key blocks wholly before it unmasked and, by sub-blocks of as many rows as a key block,
those across the diagonal masked; the running-maximum pass and the derivative's pass in a
scan over every key block that branches (``lax.cond``) on each.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

#: the matmul precision of every kernel (full float32 on GPUs, whose default is TF32)
HIGHEST = jax.lax.Precision.HIGHEST

MODES = ("bound", "zero", "running", "hardmax")
STEPS = ("dot", "fused")
LOGITS = ("matmul", "fused")
#: accelerators use the ``"fused"`` block step up to this many coordinates, ``"dot"`` above
FUSED_MAX_D = 8

#: the largest ``r_i − low_i`` (logit bound minus a known logit of the row) for which the
#: blocked kernels shift softmax weights by the bound instead of a running maximum: the
#: row's largest weight then stays above e^-60 (float32) / e^-600 (float64), a normal number.
SAFE_SHIFT = {"float32": 60.0, "float64": 600.0}
#: the same for the half-precision types the kernels also accept: bfloat16 has float32's
#: exponent range; float16's smallest normal number is e^-9.7
_SAFE_SHIFT_HALF = {"bfloat16": 60.0, "float16": 8.0}


def safe_shift(dtype) -> float:
    """:data:`SAFE_SHIFT` of a floating dtype (float16 and bfloat16 included).

    Args:
      dtype: a floating dtype.

    Returns:
      The largest ``r_i − low_i`` for which the bound shift is taken.
    """
    name = jnp.dtype(dtype).name
    return SAFE_SHIFT.get(name, _SAFE_SHIFT_HALF.get(name, 60.0))


@jax.custom_jvp
def ratio(num, den):
    """``num / den`` (den broadcast over num's last axis) whose derivative never squares den.

    The derivative is formed as ``(dnum − (num/den) dden) / den``, not by the quotient rule
    with ``den²``: a normaliser as small as e^-60 (float32, bound shift) squares to 0, which
    made the gradient inf/NaN where the value is fine.

    Args:
      num: numerator.
      den: denominator, broadcast against ``num``.

    Returns:
      ``num / den``.
    """
    return num / den


@ratio.defjvp
def _ratio_jvp(primals, tangents):
    num, den = primals
    dnum, dden = tangents
    out = num / den
    return out, (dnum - out * dden) / den


def all_at_most(a, limit):
    """``all(a <= limit)``; under ``vmap`` one answer for the whole batch (unbatched).

    A ``lax.cond`` on it then stays a branch instead of becoming a select of both sides. The
    answer is a boolean, so no derivative flows through it: its inputs are cut from the
    gradient (reverse mode through a branch chosen by it works).

    Args:
      a: array.
      limit: scalar.

    Returns:
      Boolean scalar.
    """
    return _all_at_most(jax.lax.stop_gradient(a), jax.lax.stop_gradient(limit))


@jax.custom_batching.custom_vmap
def _all_at_most(a, limit):
    return jnp.all(a <= limit)


@_all_at_most.def_vmap
def _all_at_most_vmap(axis_size, in_batched, a, limit):
    return jnp.all(a <= limit), False


def pad_rows(a, multiple, fill=None, value=0):
    """Pad the leading axis to a multiple of ``multiple``.

    Args:
      a: array (n, ...).
      multiple: the block size.
      fill: None to pad with ``value``, or the index of the row of ``a`` to repeat.
      value: the padding value when ``fill`` is None.

    Returns:
      (padded array, number of blocks), at least one block.
    """
    n = a.shape[0]
    nb = max(1, math.ceil(n / multiple))
    pad = nb * multiple - n
    if pad:
        if fill is None:
            extra = jnp.full((pad,) + a.shape[1:], value, a.dtype)
        else:
            extra = jnp.broadcast_to(a[fill], (pad,) + a.shape[1:])
        a = jnp.concatenate([a, extra], axis=0)
    return a, nb


def guarded_shift(r, low, maximum, safe):
    """The shift of a dense tile's weights: the bound where it is safe, else the maximum.

    ``r`` where every ``r − low <= safe`` (``low``: known logits of the rows, e.g. ``l_ii``
    for self-attention), else ``maximum()``, the rows' maximum (computed on that branch
    only); a NaN anywhere takes the maximum. Without derivative: the shift cancels in the
    weights.

    Args:
      r: upper bounds of the rows' logits.
      low: a known logit of each row, shaped like ``r``.
      maximum: zero-argument function returning the rows' maximum, shaped like ``r``.
      safe: the guard (:func:`safe_shift`).

    Returns:
      The shift, shaped like ``r``.
    """
    ok = all_at_most(jax.lax.stop_gradient(r - low), safe)
    return jax.lax.stop_gradient(jax.lax.cond(ok, lambda: r, maximum))


# ----------------------------------------------------------------------------- key blocks


class KeyBlocks(NamedTuple):
    """Keys cut into blocks of ``kb``: the scanned operand of every blocked kernel.

    Attributes:
      keys: (nb, kb, p) keys, the last block padded by repeating key 0.
      vals: (nb, kb, e + 1) values with a ones column (the normaliser), padded with zeros.
      bias: (nb, kb) per-key bias (padded like the keys), or None.
      pos: (nb, kb) key positions (padded with key 0's), or None without positions.
      start: (nb,) the position of each block's first key.
    """

    keys: jax.Array
    vals: jax.Array
    bias: jax.Array | None
    pos: jax.Array | None
    start: jax.Array


def key_blocks(keys, values, k_block, *, bias=None, positions=False):
    """Cut keys, values (augmented with the normaliser's ones column) and bias into blocks.

    Args:
      keys: (m, p).
      values: (m, e) (e may be 0: the normaliser alone).
      k_block: block size (clipped to m).
      bias: (m,) per-key bias or None.
      positions: whether the kernel needs key positions (ALiBi, causal mask).

    Returns:
      :class:`KeyBlocks`.
    """
    m, p = keys.shape
    dtype = keys.dtype
    kb = max(1, min(int(k_block), m))
    kp, nb = pad_rows(keys, kb, fill=0)
    vals, _ = pad_rows(jnp.concatenate([values.astype(dtype), jnp.ones((m, 1), dtype)], axis=1),
                       kb)
    bp = None if bias is None else pad_rows(bias.astype(dtype), kb, fill=0)[0].reshape(nb, kb)
    pos = None
    if positions:
        pos = pad_rows(jnp.arange(m, dtype=jnp.int32), kb, fill=0)[0].reshape(nb, kb)
    return KeyBlocks(kp.reshape(nb, kb, p), vals.reshape(nb, kb, values.shape[1] + 1), bp, pos,
                     jnp.arange(nb, dtype=jnp.int32) * kb)


def _col(a, t):
    """A per-key vector as a column of a tile (keys on axis 0 when ``t``, else axis 1)."""
    return a[:, None] if t else a[None, :]


def _row(a, t):
    """A per-query vector along a tile's query axis."""
    return a[None, :] if t else a[:, None]


def _decorate(l, blk, qpos, alibi, masked, t=False):
    """Add the key bias, the ALiBi term and (``masked``) the mask to a tile ((keys, queries) if t)."""
    if blk.bias is not None:
        l = l + _col(blk.bias, t)
    if alibi is not None:
        l = l - alibi * jnp.abs(_row(qpos, t) - _col(blk.pos, t)).astype(l.dtype)
    if masked:
        l = jnp.where(_col(blk.pos, t) <= _row(qpos, t), l, -jnp.inf)
    return l


def _dot_logits(q, blk, qpos, alibi, masked):
    """A (queries, keys) logits tile by a matrix product."""
    return _decorate(jnp.matmul(q, blk.keys.T, precision=HIGHEST), blk, qpos, alibi, masked)


def _broadcast_logits(q, blk, qpos, alibi, masked):
    """A (queries, keys) logits tile by broadcast multiply-adds (fusable on accelerators)."""
    yk = blk.keys
    l = q[:, 0:1] * yk[None, :, 0]
    for c in range(1, q.shape[1]):
        l = l + q[:, c:c + 1] * yk[None, :, c]
    return _decorate(l, blk, qpos, alibi, masked)


# ------------------------------------------------------------------------- the recurrences


def running_update(mx, acc, l, weighted_sum, *, hardmax=False):
    """Fold a logits tile into the running (maximum, rescaled sums) of every row.

    ``M_new = max(M, max_j l_ij)``, ``A ← A e^{M − M_new} + Σ_j e^{l_ij − M_new} w_j`` with
    ``M_new = −∞`` (only masked logits so far) read as 0; the maximum carries no derivative
    (it cancels). ``hardmax``: the running arg-max set instead, ``A ← A [M = M_new] +
    Σ_j [l_ij = M_new] w_j``.

    Args:
      mx: (rows,) running maximum (−∞ at the start).
      acc: (rows, ...) running sums.
      l: (rows, kb) logits tile.
      weighted_sum: maps a (rows, kb) weight tile to its sums, shaped like ``acc``.
      hardmax: keep the arg-max set instead of softmax weights.

    Returns:
      (new maximum, new sums).
    """
    new = jax.lax.stop_gradient(jnp.maximum(mx, jnp.max(l, axis=-1)))
    expand = (slice(None),) + (None,) * (acc.ndim - 1)
    if hardmax:
        keep = (mx == new).astype(acc.dtype)  # the previous arg-max set survives
        hit = (l == new[:, None]).astype(acc.dtype)
        return new, acc * keep[expand] + weighted_sum(hit)
    ref = finite_or_zero(new)
    return new, acc * jnp.exp(mx - ref)[expand] + weighted_sum(jnp.exp(l - ref[:, None]))


def finite_or_zero(mx):
    """The reference a running maximum stands for: ``mx`` where finite, else 0.

    Args:
      mx: running maximum.

    Returns:
      ``where(isfinite(mx), mx, 0)``.
    """
    return jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), mx.dtype))


def _scan_keys(body, init, blocks, qpos, causal, start=None):
    """``body(carry, block, masked)`` folded over the key blocks (causal: skip or mask blocks)."""
    # ``start`` maps a block to its first key's position (default: ``block.start``)
    # Under a causal mask, key blocks wholly after the query block are skipped (the choice
    # depends on positions only: under vmap it stays a branch) and the others masked: a
    # scan, which reverse mode transposes (the derivative's pass) and accelerators run
    # without reading a trip count back (the running-maximum pass). Every visited block is
    # masked: a three-way switch masking only those across the diagonal would make reverse
    # mode keep every branch's residuals.
    if not causal:
        def step(carry, blk):
            return body(carry, blk, False), None

        return jax.lax.scan(step, init, blocks)[0]
    last = qpos[-1]  # positions are sorted within a query block
    start = start or (lambda b: b.start)

    def step(carry, blk):
        # skipped where every query is before the block: under vmap over query offsets, of
        # every member (one unbatched branch, the mask serving the others; a batched
        # predicate would run both sides and select, with a stop_gradient in the linear
        # pass that reverse mode cannot transpose)
        skip = all_at_most(last, start(blk) - 1)
        carry = jax.lax.cond(skip, lambda c: c, lambda c: body(c, blk, True), carry)
        return carry, None

    return jax.lax.scan(step, init, blocks)[0]


def _fold_causal(body, init, blocks, qpos, *, row_axis):
    """``body(carry, block, masked, rows)`` over the key blocks a causal query block sees."""
    # Loops whose trip counts are the query block's own (``fori_loop`` with traced bounds: a
    # ``while_loop``, so for the primal passes only, never for a pass that is transposed):
    # first the key blocks wholly at or before the block's first query, unmasked, on every
    # row; then, by sub-blocks of as many rows as a key block (``rows``: a static slice of
    # the block's rows, ``carry`` those rows'), the key blocks wholly before the sub-block,
    # unmasked, and those across its diagonal, masked. Key blocks wholly after a row are
    # never visited: the masked work is a key block's triangle per sub-block, whatever the
    # query block, less than :func:`_scan_keys` masks (``benchmarks/bench_causal.py``).
    nb, kb = blocks.keys.shape[:2]
    rows = qpos.shape[0]

    def seen(pos):  # the key blocks whose every key j <= pos
        return jnp.clip((pos + 1) // kb, 0, nb)

    def reach(pos):  # the key blocks whose first key j <= pos
        return jnp.clip(pos // kb + 1, 0, nb)

    def loop(lo, hi, carry, sl, masked):
        def step(j, c):
            return body(c, jax.tree.map(lambda a: a[j], blocks), masked, sl)

        return jax.lax.fori_loop(lo, hi, step, carry)

    lo = seen(qpos[0])
    carry = loop(0, lo, init, slice(None), False)
    parts = []
    for s in range(0, rows, kb):
        sl = slice(s, min(s + kb, rows))
        part = jax.lax.slice_in_dim(carry, sl.start, sl.stop, axis=row_axis)
        mid = seen(qpos[sl.start])
        if s:  # the first sub-block starts at the block's first query: mid == lo
            part = loop(lo, mid, part, sl, False)
        parts.append(loop(mid, reach(qpos[sl.stop - 1]), part, sl, True))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=row_axis)


def _weighted_sum(step, vk):
    """``w ↦ Σ_j w_ij vk_j``: a product (``"dot"``) or sibling reductions (``"fused"``)."""
    # sibling reductions sharing w: one multi-output fusion on accelerators
    if step == "dot":
        return lambda w: jnp.matmul(w, vk, precision=HIGHEST)
    return lambda w: jnp.stack([jnp.sum(w * vk[None, :, c], axis=-1)
                                for c in range(vk.shape[1])], axis=-1)


def _running_pass(q, qpos, blocks, alibi, causal, step, hardmax):
    """The running-maximum recurrence over every key block: (maximum, sums)."""
    tile = _dot_logits if step == "dot" else _broadcast_logits

    def body(carry, blk, masked):
        mx, acc = carry
        l = tile(q, blk, qpos, alibi, masked)
        return running_update(mx, acc, l, _weighted_sum(step, blk.vals), hardmax=hardmax)

    rows = q.shape[0]
    init = (jnp.full((rows,), -jnp.inf, q.dtype),
            jnp.zeros((rows, blocks.vals.shape[2]), q.dtype))
    return _scan_keys(body, init, blocks, qpos, causal)


def _fixed_pass(q, qpos, r, blocks, alibi, causal, logits, step="dot"):
    """``Σ_j e^{l_ij − r_i} [v_j, 1]`` over every key block: no recurrence, one pass a tile."""
    # step "fused": the accelerators' tile (broadcast logits, sibling reductions); otherwise
    # ``logits`` picks the CPU tile, whose causal passes visit the key blocks by
    # :func:`_fold_causal`
    rows, p = q.shape
    ncol = blocks.vals.shape[2]
    if step == "fused":
        def body(acc, blk, masked):
            l = _broadcast_logits(q, blk, qpos, alibi, masked)
            return acc + _weighted_sum(step, blk.vals)(jnp.exp(l - r[:, None]))

        return _scan_keys(body, jnp.zeros((rows, ncol), q.dtype), blocks, qpos, causal)
    if logits == "matmul":
        def body(acc, blk, masked, sl=slice(None)):
            l = _dot_logits(q[sl], blk, _take(qpos, sl), alibi, masked)
            return acc + jnp.matmul(jnp.exp(l - r[sl, None]), blk.vals, precision=HIGHEST)

        init = jnp.zeros((rows, ncol), q.dtype)
        if causal:
            return _fold_causal(body, init, blocks, qpos, row_axis=0)
        return _scan_keys(body, init, blocks, qpos, causal)
    # "fused": the tile is (keys, queries), so the queries run along the vector lanes and each
    # key's coordinates are loop-invariant scalars; the logits are p multiply-adds inside the
    # exponential's loop (the tile is written once, by the exponential, and read once, by the
    # product with the values, transposed once for all blocks).
    qt = q.T  # (p, rows)

    def body(acct, blk, masked, sl=slice(None)):
        yk = blk.keys
        l = yk[:, 0:1] * qt[0, sl][None, :] - r[None, sl]
        for c in range(1, p):
            l = l + yk[:, c:c + 1] * qt[c, sl][None, :]
        l = _decorate(l, blk, _take(qpos, sl), alibi, masked, t=True)
        return acct + jnp.matmul(blk.vals, jnp.exp(l), precision=HIGHEST)

    blocks_t = blocks._replace(vals=jnp.swapaxes(blocks.vals, 1, 2))  # (nb, e + 1, kb)
    init = jnp.zeros((ncol, rows), q.dtype)
    if causal:
        return _fold_causal(body, init, blocks_t, qpos, row_axis=1).T
    return _scan_keys(body, init, blocks_t, qpos, causal).T


def _take(a, sl):
    """Rows ``sl`` of an optional per-query vector."""
    return None if a is None else a[sl]


def bound(q, keys, bias=None, *, amgm=None, causal=False, qpos=None):
    """An upper bound ``r_i`` of ``⟨q_i, k_j⟩ + b_j`` over j, without derivative.

    Cauchy–Schwarz, ``r_i = |q_i| max_j |k_j| + max_j b_j``; with ``amgm = s > 0`` also the
    AM–GM bound ``s|q_i|²/2 + max_j (|k_j|²/(2s) + b_j)`` and the smaller of the two (for L2
    logits, ``q = 2βq'``, ``b_j = −β|k_j|² + …`` and ``s = 1/(2β)``, it is ``β|q'_i|² + max_j …``,
    tight where a key is near the query). ``causal``: the maxima over j ≤ i only (n = m), so
    that ``r_i`` depends on the keys row i sees and on no other (row i at position
    ``qpos_i``, default i).

    Args:
      q: (n, p) queries.
      keys: (m, p) keys.
      bias: (m,) per-key bias or None.
      amgm: the AM–GM scale s (used where s > 0), or None.
      causal: maxima over the prefix j ≤ i.
      qpos: (n,) positions of the query rows under a causal mask (None: 0..n−1, n = m).

    Returns:
      (n,) bound.
    """
    def mx(a):  # max_j a_j, over j <= i under a causal mask
        if not causal:
            return jnp.max(a)
        c = jax.lax.cummax(a)
        return c if qpos is None else c[jnp.clip(qpos, 0, a.shape[0] - 1)]

    q, keys = jax.lax.stop_gradient(q), jax.lax.stop_gradient(keys)
    bias = None if bias is None else jax.lax.stop_gradient(bias)
    k2 = jnp.sum(keys * keys, axis=1)
    q2 = jnp.sum(q * q, axis=1)
    r = jnp.sqrt(q2) * jnp.sqrt(mx(k2)) + (0.0 if bias is None else mx(bias))
    if amgm is not None:  # a bound only for s > 0 (β > 0)
        s = jax.lax.stop_gradient(amgm)
        kb = k2 / (2 * s) if bias is None else k2 / (2 * s) + bias
        r = jnp.where(s > 0, jnp.minimum(r, s * q2 / 2 + mx(kb)), r)
    return r


def map_query_blocks(fn, q_block, *rows):
    """``fn(*row_blocks)`` on blocks of ``q_block`` rows of every array of ``rows``.

    The last block is padded by repeating the last row; the outputs (a pytree of arrays
    with the rows leading) are cut back to n rows. One block: ``fn`` on the whole arrays.

    Args:
      fn: maps row blocks (None entries passed through) to a pytree of (rows, ...) arrays.
      q_block: block size.
      *rows: arrays with n leading rows, or None.

    Returns:
      ``fn``'s outputs for all n rows.
    """
    n = rows[0].shape[0]
    qb = max(1, min(int(q_block), n))
    if n <= qb:
        return fn(*rows)
    nb = math.ceil(n / qb)

    def cut(a):
        return None if a is None else pad_rows(a, qb, fill=-1)[0].reshape((nb, qb) + a.shape[1:])

    out = jax.lax.map(lambda a: fn(*a), tuple(cut(a) for a in rows))
    return jax.tree.map(lambda o: o.reshape((nb * qb,) + o.shape[2:])[:n], out)


def stream(q, blocks, *, mode, q_block, step="dot", logits="matmul", r=None, low=None,
           alibi=None, causal=False, safe=None, q_offset=None):
    """The sums ``A_i`` and references ``ref_i`` of every query row (module doc).

    Args:
      q: (n, p) queries (pre-scaled: the logits are ``⟨q_i, k_j⟩ + …``).
      blocks: :class:`KeyBlocks`.
      mode: ``"bound"`` (the shift ``r`` where safe, else the running maximum), ``"zero"``
        (no shift), ``"running"`` (running maximum) or ``"hardmax"``.
      q_block: query block size.
      step: ``"dot"`` | ``"fused"``: the running recurrence's tile (matrix products, or
        broadcasts and sibling reductions).
      logits: ``"matmul"`` | ``"fused"``: the fixed-shift pass's tile (a product, or formed
        inside the exponential's loop on a transposed tile).
      r: (n,) upper bounds of the rows' logits (``"bound"``).
      low: (n,) a known logit of each row, or None for the maximum of the first key block
        (``"bound"``).
      alibi: ALiBi slope (scalar) or None.
      causal: mask ``j > i`` (positions: row and key indices).
      safe: the bound shift's guard (``"bound"``); None: :func:`safe_shift` of q's dtype.
      q_offset: the position of query row 0 (an integer scalar, may be traced; None: 0).

    Returns:
      (ref, A): (n,) references and (n, e + 1) sums; ``A[:, :e] / A[:, e:]`` is the average,
      ``ref + log A[:, e]`` the log-sum-exp.
    """
    n = q.shape[0]
    dtype = q.dtype
    qpos = query_positions(n, q_offset) if (alibi is not None or causal) else None
    if mode == "bound":
        safe = jnp.asarray(safe_shift(dtype) if safe is None else safe, dtype)

    def one(qb_, pb_, rb_, lb_):
        if mode in ("running", "hardmax"):
            mx, acc = _running_pass(qb_, pb_, blocks, alibi, causal, step, mode == "hardmax")
            return finite_or_zero(mx), acc
        if mode == "zero":
            zero = jnp.zeros((qb_.shape[0],), dtype)
            return zero, _fixed_pass(qb_, pb_, zero, blocks, alibi, causal, logits, step)
        if lb_ is None:  # the row's maximum over the first key block (key 0 is never masked)
            first = jax.tree.map(lambda a: a[0], blocks)
            lb_ = jnp.max(_dot_logits(qb_, first, pb_, alibi, causal), axis=1)
        gap = jax.lax.stop_gradient(rb_ - lb_)
        ok = all_at_most(gap, safe)

        def running(qv):
            mx, acc = _running_pass(qv, pb_, blocks, alibi, causal, "dot", False)
            return finite_or_zero(mx), acc

        if not causal:
            return jax.lax.cond(
                ok, lambda qv: (rb_, _fixed_pass(qv, pb_, rb_, blocks, alibi, causal, logits)),
                running, qb_)
        # Causal: row by row, so that row i's result depends on rows and keys <= i only (a
        # later row must not flip the block's choice): the shifted pass always, the running
        # one where a row of the block needs it, each row taking its own.
        acc = _fixed_pass(qb_, pb_, rb_, blocks, alibi, causal, logits)
        ref_r, acc_r = jax.lax.cond(ok, lambda qv: (rb_, acc), running, qb_)
        row_ok = gap <= safe
        return jnp.where(row_ok, rb_, ref_r), jnp.where(row_ok[:, None], acc, acc_r)

    if mode == "bound":
        r = jax.lax.stop_gradient(r)
        low = None if low is None else jax.lax.stop_gradient(low)
    return map_query_blocks(one, q_block, q, qpos, r if mode == "bound" else None,
                            low if mode == "bound" else None)



def query_positions(n, q_offset=None):
    """Positions ``q_offset + i`` of n query rows (int32; ``q_offset`` None: 0).

    Args:
      n: number of rows.
      q_offset: position of row 0, an integer scalar (may be traced), or None.

    Returns:
      (n,) int32 positions.
    """
    pos = jnp.arange(n, dtype=jnp.int32)
    return pos if q_offset is None else pos + jnp.asarray(q_offset, jnp.int32)


# ------------------------------------------------------- the sums with a blocked derivative


class CoreOptions(NamedTuple):
    """The static options of :func:`sums` (hashable: one program an option set)."""

    mode: str
    q_block: int
    k_block: int
    step: str
    logits: str
    causal: bool
    positions: bool
    safe: float | None


def sums(q, keys, values, *, mode, q_block, k_block, step="dot", logits="matmul", bias=None,
         alibi=None, r=None, low=None, causal=False, safe=None, q_offset=None):
    """The references and sums ``(ref, A)`` of :func:`stream`, with a blocked derivative.

    ``A_i = Σ_j e^{l_ij − ref_i} [v_j, 1]``, ``l_ij = ⟨q_i, k_j⟩ + b_j − α|i − j|`` (module
    doc); ``ref`` carries no derivative (it cancels in the average and the log-sum-exp). The
    derivative (forward mode, and reverse mode by its transpose) is a second blocked pass,

        dA_i = Σ_j e^{l_ij − ref_i} (dl_ij [v_j, 1] + [dv_j, 0]),
        dl_ij = ⟨dq_i, k_j⟩ + ⟨q_i, dk_j⟩ + db_j − dα |i − j|,

    whose tile step is rematerialised (``jax.checkpoint``): reverse mode stores the inputs
    and ``ref``, O((n + m)(p + e)), and recomputes each tile's exponentials, never the
    N × M weights (the flash-attention backward pass). ``"hardmax"`` sums take the plain
    derivative of :func:`stream` (only the values carry one).

    Args:
      q: (n, p) queries (pre-scaled).
      keys: (m, p) keys.
      values: (m, e) values (e may be 0: the normaliser alone).
      mode: ``"bound"`` | ``"zero"`` | ``"running"`` | ``"hardmax"`` (:func:`stream`).
      q_block: query block size.
      k_block: key block size.
      step: ``"dot"`` | ``"fused"`` (:func:`stream`).
      logits: ``"matmul"`` | ``"fused"`` (:func:`stream`).
      bias: (m,) per-key bias, or None.
      alibi: ALiBi slope (scalar), or None.
      r: (n,) upper bounds of the rows' logits (``"bound"``), without derivative.
      low: (n,) a known logit of each row, or None (``"bound"``), without derivative.
      causal: mask ``j > i``.
      safe: the bound shift's guard; None: :func:`safe_shift` of q's dtype.
      q_offset: the position of query row 0 (integer scalar, may be traced), or None.

    Returns:
      (ref, A): (n,) references and (n, e + 1) sums.
    """
    opts = CoreOptions(mode, int(q_block), int(k_block), step, logits, bool(causal),
                       bool(causal or alibi is not None), safe)
    if mode == "bound":
        r = jax.lax.stop_gradient(r)
        low = None if low is None else jax.lax.stop_gradient(low)
    if mode == "hardmax":
        return _sums(q, keys, values, bias, alibi, r, low, q_offset, opts)
    return _core(q, keys, values, bias, alibi, r, low, q_offset, opts)


def _sums(q, keys, values, bias, alibi, r, low, q_offset, opts):
    """:func:`stream` over the key blocks of ``keys``, ``values`` and ``bias``."""
    blocks = key_blocks(keys, values, opts.k_block, bias=bias, positions=opts.positions)
    return stream(q, blocks, mode=opts.mode, q_block=opts.q_block, step=opts.step,
                  logits=opts.logits, r=r, low=low, alibi=alibi, causal=opts.causal,
                  safe=opts.safe, q_offset=q_offset)


@functools.partial(jax.custom_jvp, nondiff_argnums=(8,))
def _core(q, keys, values, bias, alibi, r, low, q_offset, opts):
    """:func:`sums` (softmax and unnormalised modes), whose derivative is blocked."""
    return _primal(q, keys, values, bias, alibi, r, low, q_offset, opts)


# Rematerialised: inside an outer loop (heads, Sinkhorn sweeps) reverse mode would otherwise
# hoist the tiles' loop-invariant parts (masks, logits of unchanged queries and keys) out of
# the loop and store them for every tile, N × M values.
_primal = jax.checkpoint(_sums, static_argnums=(8,), prevent_cse=False,
                         policy=jax.checkpoint_policies.nothing_saveable)


def _tangent(t):
    """A tangent, or None where it is symbolically zero (or absent)."""
    return None if t is None or isinstance(t, SymbolicZero) else t


@functools.partial(_core.defjvp, symbolic_zeros=True)
def _core_jvp(opts, primals, tangents):
    q, keys, values, bias, alibi, r, low, q_offset = primals
    ref, acc = _core(q, keys, values, bias, alibi, r, low, q_offset, opts)
    dq, dk, dv, db, da = (_tangent(t) for t in tangents[:5])
    if alibi is None:
        da = None
    if bias is None:
        db = None
    if all(t is None for t in (dq, dk, dv, db, da)):
        dacc = jnp.zeros_like(acc)
    else:
        dacc = _tangent_pass(q, keys, values, bias, alibi, ref, q_offset, dq, dk, dv, db, da,
                             opts)
    return (ref, acc), (jnp.zeros_like(ref), dacc)


def _tangent_pass(q, keys, values, bias, alibi, ref, q_offset, dq, dk, dv, db, da, opts):
    """``dA`` of :func:`sums` (its doc), one rematerialised tile at a time."""
    n, m, e = q.shape[0], keys.shape[0], values.shape[1]
    dtype = q.dtype
    kb = max(1, min(int(opts.k_block), m))
    blocks = key_blocks(keys, values, kb, bias=bias, positions=opts.positions)
    nb = blocks.keys.shape[0]

    def cut(a, fill):  # a key-side tangent in blocks (padded keys: zero tangent)
        if a is None:
            return None
        return pad_rows(a.astype(dtype), kb, value=fill)[0].reshape((nb, kb) + a.shape[1:])

    # the values' tangent with a zero column for the normaliser
    dvb = None if dv is None else cut(jnp.concatenate([dv, jnp.zeros((m, 1), dtype)], 1), 0)
    tb = (cut(dk, 0), dvb, cut(db, 0))
    qpos = query_positions(n, q_offset) if opts.positions else None

    def rows(qr, pr, refr, dqr):
        def body(acc, blk, masked):
            kblk, (dkb, dvb_, dbb) = blk
            l = _dot_logits(qr, kblk, pr, alibi, masked)
            p = jnp.exp(l - refr[:, None])
            terms = []
            if dqr is not None:
                terms.append(jnp.matmul(dqr, kblk.keys.T, precision=HIGHEST))
            if dkb is not None:
                terms.append(jnp.matmul(qr, dkb.T, precision=HIGHEST))
            if dbb is not None:
                terms.append(jnp.broadcast_to(dbb[None, :], l.shape))
            if da is not None:
                terms.append(-da * jnp.abs(pr[:, None] - kblk.pos[None, :]).astype(dtype))
            if terms:
                dl = sum(terms[1:], terms[0])
                acc = acc + jnp.matmul(p * dl, kblk.vals, precision=HIGHEST)
            if dvb_ is not None:
                acc = acc + jnp.matmul(p, dvb_, precision=HIGHEST)
            return acc

        # rematerialised: reverse mode keeps the step's inputs, not its (rows, kb) tiles
        step = jax.checkpoint(body, static_argnums=(2,), prevent_cse=False,
                              policy=jax.checkpoint_policies.nothing_saveable)
        init = jnp.zeros((qr.shape[0], e + 1), dtype)
        return _scan_keys(step, init, (blocks, tb), pr, opts.causal, start=lambda b: b[0].start)

    return map_query_blocks(rows, opts.q_block, q, qpos, ref, dq)
