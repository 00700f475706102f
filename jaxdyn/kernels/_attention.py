"""Attention interaction kernels: the hot loop of every particle model.

Every kernel computes, for queries ``x`` (n, d) and keys/values ``y`` (m, d),

    m_i = Σ_j w_ij y_j ,    logits  l_ij = β x_iᵀ B y_j

with one of three normalisations of the weights:

* ``"softmax"``       w_ij = exp(l_ij) / Σ_k exp(l_ik)              (SA, Paper A)
* ``"unnormalized"``  w_ij = exp(l_ij) / m                          (USA, GLPR)
* ``"hardmax"``       w_ij = 1/|J_i| on J_i = argmax_j x_iᵀ B y_j   (β = ∞ on the
                      empirical measure; ties share the weight)

The value matrix is applied by the caller (``V m_i``), since ``V Σ_j w_ij y_j`` costs d²
per query instead of d² per pair.

Two implementations with identical results (within 1e-5 relative in float32, 1e-12 in
float64):

* ``dense``: materialises the (n, m) logits; fastest for small m.
* ``blocked``: online (streaming) softmax over key blocks (Rabe & Staats 2021, the
  flash-attention recurrence), with query blocks as well. Per key block ``k``:

      M ← max(M, max_j l_ij),   A ← A·e^{M_old − M} + Σ_{j∈k} e^{l_ij − M} [y_j, 1]

  and ``m_i = A_i[:d] / A_i[d]``: the weighted sum and the normaliser come out of one
  product with the augmented values ``[y_j, 1]``. Memory O(q_block · k_block), never
  O(n · m). Padded keys (m not a multiple of the block) repeat a real key, so they never
  raise the running maximum, and carry the value ``[0, 0]``, so they add nothing.

The blocked kernel has two formulations of a block step, picked per platform at lowering
time (:func:`jax.lax.platform_dependent`):

* ``"dot"`` (CPU): logits and the weighted sums as matrix products, the exponential as one
  elementwise loop between them (XLA:CPU vectorises these well; fused broadcast
  formulations of the logits were measured 10× slower there).
* ``"fused"`` (GPU and other accelerators, d ≤ ``FUSED_MAX_D``, softmax and
  unnormalised): logits as broadcast multiply-adds and the weighted sums as sibling
  reductions, which XLA:GPU can fuse into two kernels a block that never write the
  (q_block, k_block) tile to memory. Hardmax always uses ``"dot"``: its equality test
  against the running maximum needs logits computed once.

Softmax weights are computed shifted, so β xᵀBy of order 10⁴ does not overflow float32. On
CPU the shift is the Cauchy–Schwarz bound of the row's logits, ``|β Bᵀx_i| · max_j |y_j|``,
whenever that keeps the row's largest weight in range (checked per query block against a
known logit of the row; ``SAFE_SHIFT``): one pass over each tile instead of a maximum, an
exponential and a rescaling (measured 1.25–1.5× faster at N = 4096–16384 on 2 cores).
Otherwise, and always on accelerators, the running maximum. With a fixed shift (the bound,
or none for unnormalised weights) and d ≤ ``FUSED_MAX_D``, the CPU step forms the logits
inside the exponential's loop on a (keys × queries) tile (``logits="fused"``): the tile is
written once and read once, instead of written by a logits product, read and written by the
exponential and read by the values product (0.87–0.91× the CPU time at N = 4096–8192 with
AVX-512, 0.96–0.99× with XLA capped at AVX2: ``benchmarks/bench_roofline.py --logits-ab``).
Matmuls run at ``Precision.HIGHEST`` (on GPUs float32 matmuls otherwise default to TF32,
which ruins logits at large β). Float64 runs everywhere once
``jax.config.update("jax_enable_x64", True)`` is set and the inputs are float64.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST

KERNELS = ("dense", "blocked", "auto")
NORMALIZATIONS = ("softmax", "unnormalized", "hardmax")
FORMULATIONS = ("dot", "fused")
FUSED_MAX_D = 8  # accelerators use the "fused" block step up to this d, "dot" above
LOGITS = ("matmul", "fused")

# ``kernel="auto"`` switches to the blocked kernel at this many keys and above. Measured on
# a 2-core AVX-512 CPU (benchmarks/bench_large_n.py): dense and blocked tie near 512 keys;
# at 1024 keys and above the blocked kernel wins, and dense memory grows as n·m.
AUTO_BLOCKED_MIN_KEYS = 1024

# Default block sizes (used when ``k_block``/``q_block`` are None), per platform. CPU: the
# (q_block, k_block) float32 tile of 4 MiB streams through L2/L3 and each key block is
# reused by all queries of the block; measured on a 2-core AVX-512 machine over grids at
# N = 4096 (k_block 32-4096 × q_block 32-4096) and N = 16384: k_block 256-1024 with
# q_block 1024-4096 all within noise of each other, smaller key blocks clearly slower.
# Accelerators: large tiles so that each scan step is one big fused kernel (a step costs a
# kernel launch); not yet measured on a GPU: benchmarks/gpu.sh probes alternatives first.
DEFAULT_BLOCKS = {
    "cpu": (256, 4096),  # (k_block, q_block)
    "gpu": (8192, 32768),
}


#: the largest ``r_i − lower_i`` (logit bound minus a known logit of the row) for which the
#: blocked kernel shifts softmax weights by the bound instead of a running maximum: the
#: row's largest weight then stays above e^-60 (float32) / e^-600 (float64), a normal number.
SAFE_SHIFT = {"float32": 60.0, "float64": 600.0}
#: the same for the half-precision types the kernels also accept: bfloat16 has float32's
#: exponent range; float16's smallest normal number is e^-9.7
_SAFE_SHIFT_HALF = {"bfloat16": 60.0, "float16": 8.0}


def safe_shift(dtype) -> float:
    """:data:`SAFE_SHIFT` of a floating dtype (float16 and bfloat16 included)."""
    name = jnp.dtype(dtype).name
    return SAFE_SHIFT.get(name, _SAFE_SHIFT_HALF.get(name, 60.0))


@jax.custom_jvp
def _ratio(num, den):
    """``num / den`` (den broadcast over num's last axis); its derivative is formed as
    ``(dnum − (num/den) dden) / den``, never with ``den²``: the blocked kernel's normaliser
    can be as small as e^-60 (float32, bound shift), whose square underflows to 0 and made
    the quotient rule's gradient inf/NaN where the value is fine."""
    return num / den


@_ratio.defjvp
def _ratio_jvp(primals, tangents):
    num, den = primals
    dnum, dden = tangents
    out = num / den
    return out, (dnum - out * dden) / den


def default_cpu_logits(d: int) -> str:
    """The CPU step's logits with a fixed shift (see :func:`blocked`): ``"fused"`` (inside the
    exponential's loop) where d <= ``FUSED_MAX_D``, else ``"matmul"`` (d multiply-adds a
    pair). Measured on 2 cores of an AVX-512 EPYC, one device, interleaved rounds: fused
    0.87-0.91x the CPU time of the product logits at N = 4096-8192 with AVX-512, 0.96-0.99x
    under ``--xla_cpu_max_isa=AVX2``."""
    return "fused" if d <= FUSED_MAX_D else "matmul"


@jax.custom_batching.custom_vmap
def _all_at_most(a, limit):
    """``all(a <= limit)``; under ``vmap`` one answer for the whole batch (unbatched), so a
    ``lax.cond`` on it stays a branch instead of becoming a select of both sides."""
    return jnp.all(a <= limit)


@_all_at_most.def_vmap
def _all_at_most_vmap(axis_size, in_batched, a, limit):
    return jnp.all(a <= limit), False


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def resolve_kernel(kernel: str, m: int) -> str:
    """The concrete kernel ``"auto"`` stands for at ``m`` keys."""
    _check_choice("kernel", kernel, KERNELS)
    if kernel == "auto":
        return "blocked" if m >= AUTO_BLOCKED_MIN_KEYS else "dense"
    return kernel


def _check_block(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return int(value)


def interaction(
    x,
    y,
    B,
    beta,
    *,
    normalization: str = "softmax",
    kernel: str = "auto",
    k_block: int | None = None,
    q_block: int | None = None,
):
    """Attention average ``m_i = Σ_j w_ij y_j`` with logits ``β x_iᵀ B y_j``.

    Args:
      x: queries, shape (n, d).
      y: keys (also the values averaged), shape (m, d).
      B: bilinear form, shape (d, d) (``B = Qᵀ K`` for Paper A).
      beta: inverse temperature, scalar (ignored by ``"hardmax"``).
      normalization: ``"softmax"`` | ``"unnormalized"`` | ``"hardmax"``.
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"`` (blocked from
        ``AUTO_BLOCKED_MIN_KEYS`` keys on).
      k_block, q_block: block sizes of the blocked kernel (keys, queries); None picks the
        platform's default (``DEFAULT_BLOCKS``).

    Returns:
      (n, d) array ``m``.
    """
    _check_choice("normalization", normalization, NORMALIZATIONS)
    if getattr(x, "ndim", None) != 2 or getattr(y, "ndim", None) != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(
            "interaction expects x (n, d) and y (m, d) with the same d; got "
            f"{getattr(x, 'shape', x)} and {getattr(y, 'shape', y)}"
        )
    d = x.shape[1]
    if getattr(B, "shape", None) != (d, d):
        raise ValueError(f"B must have shape ({d}, {d}); got {getattr(B, 'shape', B)}")
    if y.shape[0] < 1:
        raise ValueError("interaction needs at least one key: y has 0 rows")
    if jnp.ndim(beta) != 0:
        raise ValueError(f"beta must be a scalar (vmap over a stack for several), got shape "
                         f"{jnp.shape(beta)}")
    k_block = _check_block("k_block", k_block)
    q_block = _check_block("q_block", q_block)
    kernel = resolve_kernel(kernel, y.shape[0])
    k_block, q_block = _clip_blocks(k_block, q_block, x.shape[0], y.shape[0])
    # one program a call shape (called eagerly, op by op it compiled the key loop and a dozen
    # small programs per shape; under a caller's jit this inlines)
    return _interaction_jit(x, y, B, beta, normalization=normalization, kernel=kernel,
                            k_block=k_block, q_block=q_block, self_keys=y is x)


def _clip_blocks(k_block, q_block, n, m):
    """Block sizes as the kernel uses them (``_blocked`` takes ``min(block, rows)``): block
    sizes that mean the same blocks for these shapes give one program, not one each."""
    return (None if k_block is None else max(1, min(k_block, m)),
            None if q_block is None else max(1, min(q_block, n)))


@functools.partial(jax.jit, static_argnames=("normalization", "kernel", "k_block", "q_block",
                                             "self_keys"))
def _interaction_jit(x, y, B, beta, *, normalization, kernel, k_block, q_block, self_keys):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        # integer points (e.g. np.eye rows): computed in the default float dtype; β cast to
        # an integer dtype would be truncated (0.7 -> 0)
        x = x.astype(jnp.result_type(float))
    beta = jnp.asarray(beta, dtype=x.dtype)
    if normalization == "hardmax":
        # β plays no role; the arg-max of x_iᵀ B y_j is scale-invariant.
        beta = jnp.ones((), x.dtype)
    # self_keys: self-attention (y is x), key i is query i, so l_ii is a logit of row i
    qx = beta * jnp.matmul(x, B, precision=HIGHEST)  # (n, d): β Bᵀ x_i as rows
    y = y.astype(qx.dtype)
    if kernel == "dense":
        return _dense(qx, y, normalization)
    return blocked(qx, y, normalization, k_block=k_block, q_block=q_block, self_keys=self_keys)


def _dense(qx, y, normalization):
    logits = jnp.matmul(qx, y.T, precision=HIGHEST)  # (n, m)
    if normalization == "softmax":
        w = jax.nn.softmax(logits, axis=-1)
    elif normalization == "unnormalized":
        w = jnp.exp(logits) / y.shape[0]
    else:
        mx = jnp.max(logits, axis=-1, keepdims=True)
        hit = (logits == mx).astype(y.dtype)
        w = hit / jnp.sum(hit, axis=-1, keepdims=True)
        # a NaN row has no hit: 0/0, which XLA folds to 0 under jit; keep it NaN
        w = jnp.where(jnp.isnan(mx), jnp.nan, w)
    return jnp.matmul(w, y, precision=HIGHEST)


def blocked(qx, y, normalization="softmax", *, k_block=None, q_block=None, formulation=None,
            self_keys=False, logits=None):
    """The blocked kernel on pre-scaled queries ``qx = β Bᵀ x`` (rows), keys/values ``y``.

    ``formulation`` ``"dot"`` | ``"fused"`` forces one block step (see the module doc);
    None picks per platform at lowering time. Block sizes None: the platform default.
    ``self_keys``: the keys are the queries' own points (``y[i] = x[i]``, self-attention),
    so ``l_ii = qx_i · y_i`` is a logit of row i (used by the bound shift below).
    ``logits`` (CPU step with a fixed shift: bound-shifted softmax, unnormalised):
    ``"matmul"`` forms each tile's logits by a matrix product, ``"fused"`` inside the
    exponential's loop; None: :func:`default_cpu_logits` (by d).
    Returns (n, d).
    """
    _check_choice("normalization", normalization, NORMALIZATIONS)
    if logits is None:
        logits = default_cpu_logits(qx.shape[1])
    _check_choice("logits", logits, LOGITS)
    if formulation is not None:
        _check_choice("formulation", formulation, FORMULATIONS)
    k_block, q_block = _clip_blocks(k_block, q_block, qx.shape[0], y.shape[0])
    # one program a call shape when called eagerly (inlined under a caller's jit)
    return _blocked_jit(qx, y, normalization=normalization, k_block=k_block, q_block=q_block,
                        formulation=formulation, self_keys=bool(self_keys), logits=logits)


@functools.partial(jax.jit, static_argnames=("normalization", "k_block", "q_block",
                                             "formulation", "self_keys", "logits"))
def _blocked_jit(qx, y, *, normalization, k_block, q_block, formulation, self_keys, logits):
    if formulation is not None:
        plat = "cpu" if formulation == "dot" else "gpu"
        kb, qb = _blocks(plat, k_block, q_block)
        return _blocked(qx, y, normalization, kb, qb, formulation, self_keys, logits)
    kb_c, qb_c = _blocks("cpu", k_block, q_block)
    kb_g, qb_g = _blocks("gpu", k_block, q_block)
    # Wide d: the broadcast logits cost d multiply-adds a pair; matmuls win there too.
    # Hardmax compares each logit with the running maximum for equality, so the logits must
    # be computed once (a materialised tile), never re-derived in two fusions.
    accel = "fused" if qx.shape[1] <= FUSED_MAX_D and normalization != "hardmax" else "dot"
    return jax.lax.platform_dependent(
        qx, y,
        cpu=functools.partial(_blocked, normalization=normalization, k_block=kb_c,
                              q_block=qb_c, formulation="dot", self_keys=self_keys,
                              logits=logits),
        default=functools.partial(_blocked, normalization=normalization, k_block=kb_g,
                                  q_block=qb_g, formulation=accel, self_keys=self_keys),
    )


def _blocks(platform, k_block, q_block):
    kb, qb = DEFAULT_BLOCKS[platform]
    return (kb if k_block is None else k_block), (qb if q_block is None else q_block)


def pad_rows(a, multiple, fill=None, value=0):
    """Pad the leading axis to a multiple of ``multiple``: with ``value`` (default zeros), or
    repeating row ``fill`` of ``a``. Returns (padded, number of blocks)."""
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


def _blocked(qx, y, normalization, k_block, q_block, formulation, self_keys=False,
             logits="matmul"):
    n, d = qx.shape
    m = y.shape[0]
    dtype = qx.dtype
    kb = max(1, min(int(k_block), m))
    qb = max(1, min(int(q_block), n))
    # Keys padded by repeating key 0 (never above the running max); values augmented with
    # a ones column (the softmax normaliser / hardmax tie count) and padded with zeros.
    keys, nkb = pad_rows(y, kb, fill=0)
    vals, _ = pad_rows(jnp.concatenate([y, jnp.ones((m, 1), dtype)], axis=1), kb)
    keys = keys.reshape(nkb, kb, d)
    vals = vals.reshape(nkb, kb, d + 1)
    step = _step_dot if formulation == "dot" or normalization == "hardmax" else _step_fused
    # Bound shift (CPU "dot" step, softmax): the logits of row i never exceed
    # r_i = |qx_i| · max_j |y_j| (Cauchy–Schwarz), so exp(l_ij − r_i) never overflows and,
    # subtracted alike from numerator and normaliser, gives the same weights as the running
    # maximum without its pass over the tile and its rescaling. It could underflow: the
    # row's largest weight is at least exp(lower_i − r_i) for any known logit lower_i of the
    # row (l_ii for self-attention, else the row's maximum over the first key block), so a
    # query block takes this path only while every r_i − lower_i <= SAFE_SHIFT; otherwise,
    # and for NaN input, the running maximum. Under vmap the decision is taken once for the
    # whole batch (_all_at_most), so it stays a branch.
    bound_shift = formulation == "dot" and normalization == "softmax"
    if bound_shift:
        safe = jnp.asarray(safe_shift(dtype), dtype)
        # the shift cancels in the weights: no gradient through it (sqrt's derivative at a
        # zero row, β = 0 or a rank-deficient B, is NaN)
        ymax = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.sum(y * y, axis=1))))
        lower = jnp.sum(qx * y, axis=1) if (self_keys and m == n) else None

    def online(q):
        rows = q.shape[0]
        init = (jnp.full((rows,), -jnp.inf, dtype), jnp.zeros((rows, d + 1), dtype))
        (_, acc), _ = jax.lax.scan(
            functools.partial(step, q, normalization), init, (keys, vals))
        return acc

    def shifted(q, r):
        """Σ_j exp(l_ij − r_i) [y_j, 1] over all key blocks: no recurrence, one pass a tile."""
        if logits == "matmul":
            def body(acc, block):
                yk, vk = block
                l = jnp.matmul(q, yk.T, precision=HIGHEST)
                return acc + jnp.matmul(jnp.exp(l - r[:, None]), vk, precision=HIGHEST), None

            acc, _ = jax.lax.scan(body, jnp.zeros((q.shape[0], d + 1), dtype), (keys, vals))
            return acc
        # "fused": the tile is (keys, queries), so the queries run along the vector lanes
        # and each key's coordinates are loop-invariant scalars; the logits are d
        # multiply-adds inside the exponential's loop (the tile is written once, by the
        # exponential, and read once, by the product with the values).
        qt = q.T  # (d, rows)

        def body(acct, block):
            yk, vkt = block  # (kb, d), (d + 1, kb)
            l = yk[:, 0:1] * qt[0][None, :] - r[None, :]
            for c in range(1, d):
                l = l + yk[:, c:c + 1] * qt[c][None, :]
            return acct + jnp.matmul(vkt, jnp.exp(l), precision=HIGHEST), None

        acct, _ = jax.lax.scan(body, jnp.zeros((d + 1, q.shape[0]), dtype),
                               (keys, jnp.swapaxes(vals, 1, 2)))
        return acct.T

    def one_query_block(q, low=None):  # q: (qb, d) → (qb, d)
        if bound_shift:
            r = jax.lax.stop_gradient(jnp.sqrt(jnp.sum(q * q, axis=1))) * ymax
            if low is None:  # the row's maximum over the first key block
                low = jnp.max(jnp.matmul(q, keys[0].T, precision=HIGHEST), axis=1)
            ok = _all_at_most(jax.lax.stop_gradient(r - low), safe)
            acc = jax.lax.cond(ok, shifted, lambda q, r: online(q), q, r)
        elif formulation == "dot" and normalization == "unnormalized":
            acc = shifted(q, jnp.zeros((q.shape[0],), dtype))  # e^{l_ij}: no shift at all
        else:
            acc = online(q)
        if normalization == "unnormalized":
            return acc[:, :d] / m
        return _ratio(acc[:, :d], acc[:, d:])

    lower_rows = lower if bound_shift else None
    if n <= qb:
        return one_query_block(qx, lower_rows)
    qp, nqb = pad_rows(qx, qb, fill=0)
    if lower_rows is None:
        out = jax.lax.map(one_query_block, qp.reshape(nqb, qb, d))
    else:
        lp, _ = pad_rows(lower_rows, qb, fill=0)
        out = jax.lax.map(lambda a: one_query_block(*a), (qp.reshape(nqb, qb, d),
                                                          lp.reshape(nqb, qb)))
    return out.reshape(nqb * qb, d)[:n]


def _update(normalization, mx, acc, l, weighted_sum):
    """One online-softmax update from the logits tile ``l`` (rows, kb); ``weighted_sum(w)``
    returns Σ_j w_ij [y_j, 1] for a weight tile w."""
    if normalization == "unnormalized":
        # Global reference 0: plain exp, summed (no normalisation), as in the definition.
        return mx, acc + weighted_sum(jnp.exp(l))
    new = jnp.maximum(mx, jnp.max(l, axis=-1))
    if normalization == "hardmax":
        keep = (mx == new).astype(acc.dtype)  # previous arg-max set survives
        hit = (l == new[:, None]).astype(acc.dtype)
        return new, acc * keep[:, None] + weighted_sum(hit)
    scale = jnp.exp(mx - new)  # exp(-inf) = 0 on the first block
    return new, acc * scale[:, None] + weighted_sum(jnp.exp(l - new[:, None]))


def _step_dot(q, normalization, carry, block):
    mx, acc = carry
    yk, vk = block  # (kb, d), (kb, d + 1)
    l = jnp.matmul(q, yk.T, precision=HIGHEST)  # (qb, kb)
    return _update(normalization, mx, acc, l,
                   lambda w: jnp.matmul(w, vk, precision=HIGHEST)), None


def _step_fused(q, normalization, carry, block):
    mx, acc = carry
    yk, vk = block
    d = q.shape[1]
    l = q[:, 0:1] * yk[None, :, 0]
    for c in range(1, d):
        l = l + q[:, c:c + 1] * yk[None, :, c]

    def weighted_sum(w):  # sibling reductions sharing w: one multi-output fusion on GPU
        return jnp.stack([jnp.sum(w * vk[None, :, c], axis=-1) for c in range(d + 1)], axis=-1)

    return _update(normalization, mx, acc, l, weighted_sum), None
