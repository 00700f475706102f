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
* ``blocked``: the online softmax of :mod:`._online` over key blocks (Rabe & Staats 2021,
  the flash-attention recurrence), with query blocks as well: memory O(q_block · k_block),
  never O(n · m). The weighted sum and the normaliser come out of one product with the
  augmented values ``[y_j, 1]``.

The blocked kernel has two formulations of a block step, picked per platform at lowering
time (:func:`jax.lax.platform_dependent`):

* ``"dot"`` (CPU): logits and the weighted sums as matrix products, the exponential as one
  elementwise loop between them (XLA:CPU vectorises these well, and fused broadcast
  formulations of the logits poorly).
* ``"fused"`` (GPU and other accelerators, d ≤ ``FUSED_MAX_D``, softmax and
  unnormalised): logits as broadcast multiply-adds and the weighted sums as sibling
  reductions, which XLA:GPU can fuse into two kernels a block that never write the
  (q_block, k_block) tile to memory. Hardmax always uses ``"dot"``: its equality test
  against the running maximum needs logits computed once.

Softmax weights are computed shifted, so β xᵀBy of order 10⁴ does not overflow float32. On
CPU the shift is the Cauchy–Schwarz bound of the row's logits, ``|β Bᵀx_i| · max_j |y_j|``,
whenever that keeps the row's largest weight in range (checked per query block against a
known logit of the row; ``SAFE_SHIFT``): one pass over each tile instead of a maximum, an
exponential and a rescaling.
Otherwise, and always on accelerators, the running maximum. With a fixed shift (the bound,
or none for unnormalised weights) and d ≤ ``FUSED_MAX_D``, the CPU step forms the logits
inside the exponential's loop on a (keys × queries) tile (``logits="fused"``): the tile is
written once and read once, instead of written by a logits product, read and written by the
exponential and read by the values product (``benchmarks/bench_roofline.py --logits-ab``
compares the two).
The derivative of the blocked kernel (softmax and unnormalised weights) is the core's
second blocked pass (:func:`._online.sums`): reverse mode stores no N × M array either.
Matmuls run at ``Precision.HIGHEST`` (on GPUs float32 matmuls otherwise default to TF32,
which ruins logits at large β). Float64 runs everywhere once
``jax.config.update("jax_enable_x64", True)`` is set and the inputs are float64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._checks import nan_where, scalar_domain
from ..choices import KERNELS, NORMALIZATIONS
from ._local import DEFAULT_TOL, local_attention
from ._online import (FUSED_MAX_D, HIGHEST, LOGITS, SAFE_SHIFT, bound, pad_rows, ratio,
                      safe_shift, sums)

# ``_ratio`` and ``SAFE_SHIFT`` are shared with the ensemble driver's bound shift
_ratio = ratio

__all__ = ["AUTO_LOCAL_MAX_VISITED", "AUTO_LOCAL_MIN_KEYS", "DEFAULT_BLOCKS", "DEFAULT_TOL",
           "HIGHEST", "KERNELS", "NORMALIZATIONS", "SAFE_SHIFT", "blocked", "check_local",
           "interaction", "local_interaction", "pad_rows", "resolve_kernel"]

FORMULATIONS = ("dot", "fused")

# ``kernel="auto"`` switches to the blocked kernel at this many keys and above: below, the
# dense kernel is as fast; above, the blocked one wins and dense memory grows as n·m
# (``benchmarks/bench_large_n.py``).
AUTO_BLOCKED_MIN_KEYS = 1024
#: ``kernel="auto"`` considers the local kernel from this many keys on (softmax weights)...
AUTO_LOCAL_MIN_KEYS = 16384
#: ...and takes it where its lists visit at most this fraction of the pairs (else blocked)
AUTO_LOCAL_MAX_VISITED = 0.25

#: the default ``(k_block, q_block)`` of each platform (used when ``k_block``/``q_block`` are
#: None): on CPU a 4 MiB float32 tile that streams through L2/L3, each key block reused by all
#: queries of the block; on accelerators large tiles, so that each scan step is one fused
#: kernel (``benchmarks/gpu.sh`` probes alternatives)
DEFAULT_BLOCKS = {
    "cpu": (256, 4096),  # (k_block, q_block)
    "gpu": (8192, 32768),
}


def default_cpu_logits(d: int) -> str:
    """The CPU step's logits with a fixed shift (see :func:`blocked`).

    ``"fused"`` (inside the exponential's loop) where d <= ``FUSED_MAX_D``, else
    ``"matmul"`` (d multiply-adds a pair): the fused tile is written and read once
    (``benchmarks/bench_roofline.py --logits-ab`` compares the two).

    Args:
      d: the number of coordinates of the logits' dot product.

    Returns:
      ``"fused"`` or ``"matmul"``.
    """
    return "fused" if d <= FUSED_MAX_D else "matmul"


def _choice_error(name, value, choices):
    """The message of a ValueError for ``value`` not among ``choices``, or None."""
    return None if value in choices else f"{name} must be one of {choices}, got {value!r}"



def resolve_kernel(kernel: str, m: int, normalization: str = "softmax") -> str:
    """The concrete kernel ``"auto"`` stands for at ``m`` keys.

    Args:
      kernel: ``"dense"`` | ``"blocked"`` | ``"local"`` | ``"auto"``.
      m: number of keys.
      normalization: the weights (the local kernel serves softmax weights only).

    Returns:
      ``"dense"``, ``"blocked"``, ``"local"``, or ``"auto_local"`` (``"auto"`` from
      ``AUTO_LOCAL_MIN_KEYS`` softmax keys: the local kernel where its lists visit at most
      ``AUTO_LOCAL_MAX_VISITED`` of the pairs, decided at run time, else the blocked one);
      ``"auto"`` below that: blocked from ``AUTO_BLOCKED_MIN_KEYS`` keys, else dense.

    Raises:
      ValueError: an unknown kernel, or ``"local"`` with other than softmax weights.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "local" and normalization != "softmax":
        raise ValueError(f"kernel='local' serves softmax weights only (its certificate bounds "
                         f"the skipped share of a row's mass), got normalization="
                         f"{normalization!r}")
    if kernel == "auto":
        if m >= AUTO_LOCAL_MIN_KEYS and normalization == "softmax":
            return "auto_local"
        return "blocked" if m >= AUTO_BLOCKED_MIN_KEYS else "dense"
    return kernel


def check_local(tol, capacity):
    """The local kernel's options, checked: ``tol`` in (0, 1), ``capacity`` None or an int >= 1.

    Args:
      tol: the tolerance.
      capacity: None or the key leaves a query leaf's list holds.

    Returns:
      ``(tol, capacity)`` as a float and None or an int.

    Raises:
      ValueError: a tolerance outside (0, 1) or a bad capacity.
    """
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 < float(tol) < 1.0:
        raise ValueError(f"tol must be a number in (0, 1) (the local kernel's error relative to "
                         f"the largest value), got {tol!r}")
    if capacity is not None:
        if isinstance(capacity, bool) or not hasattr(capacity, "__index__") or int(capacity) < 1:
            raise ValueError(f"capacity must be None or an integer >= 1 (the key leaves a "
                             f"query leaf's list holds), got {capacity!r}")
        capacity = int(capacity)
    return float(tol), capacity


def _check_block(name, value):
    """A block size as a Python int (None stays None); ValueError unless a positive integer."""
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
    tol: float = DEFAULT_TOL,
    capacity=None,
):
    """Attention average ``m_i = Σ_j w_ij y_j`` with logits ``β x_iᵀ B y_j``.

    The weights are ``w_ij = exp(l_ij) / Σ_k exp(l_ik)`` (softmax), ``exp(l_ij) / m``
    (unnormalised) or uniform on the row's arg-max set (hardmax) (module doc).

    Args:
      x: queries, shape (n, d).
      y: keys (also the values averaged), shape (m, d).
      B: bilinear form, shape (d, d) (``B = Qᵀ K`` for Paper A).
      beta: inverse temperature, a finite scalar >= 0 (ignored by ``"hardmax"``). A traced
        value outside the domain gives NaN.
      normalization: ``"softmax"`` | ``"unnormalized"`` | ``"hardmax"``.
      kernel: ``"dense"`` | ``"blocked"`` | ``"local"`` | ``"auto"`` (:func:`resolve_kernel`:
        blocked from ``AUTO_BLOCKED_MIN_KEYS`` keys on, and from ``AUTO_LOCAL_MIN_KEYS`` the
        local kernel where it pays).
      k_block: key block size of the blocked kernel; None picks the platform's default
        (``DEFAULT_BLOCKS``).
      q_block: query block size of the blocked kernel; None: the platform's default.
      tol: the local kernel's certified bound of ``|m_i − m_i^dense| / max_j |y_j|``
        (:func:`local_interaction`).
      capacity: the local kernel's list capacities (None: its defaults); an overflow is
        answered by the blocked kernel.

    Returns:
      (n, d) array ``m``.

    Raises:
      ValueError: shapes that do not match, no keys, a complex x, y or B, a non-scalar
        ``beta`` or a concrete one that is negative or not finite, an unknown
        ``normalization`` or ``kernel``,
        ``"local"`` with other than softmax weights or points of dimension d < 2, a block size that is not a positive
        integer, or a bad ``tol``/``capacity``.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(_choice_error("normalization", normalization, NORMALIZATIONS))
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
    _check_real("interaction", x=x, y=y, B=B)
    if jnp.ndim(beta) != 0:
        raise ValueError(f"beta must be a scalar (vmap over a stack for several), got shape "
                         f"{jnp.shape(beta)}")
    err, bad = (None, None) if normalization == "hardmax" else scalar_domain(
        "beta", beta, low=0, what=" (inverse temperature)")
    if err:
        raise ValueError(err)
    k_block = _check_block("k_block", k_block)
    q_block = _check_block("q_block", q_block)
    asked, kernel = kernel, resolve_kernel(kernel, y.shape[0], normalization)
    if kernel == "local" and d < 2:  # the space-filling curve orders points in d >= 2
        if asked != "auto":
            raise ValueError(f"interaction: kernel='local' needs points of dimension d >= 2, "
                             f"got x of shape {x.shape}")
        kernel = "blocked"
    tol, capacity = check_local(tol, capacity)
    k_block, q_block = _clip_blocks(k_block, q_block, x.shape[0], y.shape[0])
    # one program a call shape (called eagerly, op by op it compiled the key loop and a dozen
    # small programs per shape; under a caller's jit this inlines). The bound shift's guard is
    # read here, at each call, so that it keys the program.
    m = _interaction_jit(x, y, B, beta if bad is None else jnp.where(bad, 1, beta),
                         normalization=normalization, kernel=kernel, k_block=k_block,
                         q_block=q_block, self_keys=y is x, safe=_guard(x.dtype), tol=tol,
                         capacity=capacity)[0]
    return nan_where(bad, m)


def local_interaction(x, y, B, beta, *, tol: float = DEFAULT_TOL, capacity=None,
                      max_visited=None):
    """:func:`interaction` by the local kernel, with its certificate.

    The block-sparse kernel of :mod:`jaxdyn.kernels._local`: keys and queries ordered along
    a space-filling curve into leaves with bounding caps; for each query leaf the key leaves
    whose largest possible weight can matter at ``tol`` (bounded from the caps and a lower
    bound of the row's largest logit, never estimated), computed exactly by online-softmax
    tiles; the rest skipped. Softmax weights; jit, vmap, reverse mode (a second pass over the
    same tiles) and lowering for every platform. The guarantee, at every query:
    ``|m_i − m_i^dense| ≤ stats.bound_i · max_j |y_j| ≤ tol · max_j |y_j|``.

    Args:
      x: queries, (n, d).
      y: keys, also the values averaged, (m, d).
      B: bilinear form (d, d).
      beta: inverse temperature, a finite scalar >= 0. A traced value outside the domain
        gives NaN (the averages and the bounds).
      tol: the bound of the error relative to ``max_j |y_j|``, in (0, 1).
      capacity: the key leaves (of 64 keys) a query leaf's list holds; None: a quarter of
        them, at least 256 (:func:`jaxdyn.kernels._local.local_attention`). An overflow is
        answered by the blocked kernel and reported (``stats.overflow``, ``stats.dense``).
      max_visited: also answer by the blocked kernel where the lists would visit more than
        this fraction of the pairs (None: never).

    Returns:
      ``(m, stats)``: (n, d) averages and :class:`~jaxdyn.kernels.LocalStats` (``bound``
      the certified error bound of each row, ``mass`` its skipped-mass bound, ``visited`` the
      fraction of pairs computed, ``listed`` the lists' fraction, ``overflow``, ``kept`` the
      longest lists, ``dense`` whether the blocked kernel answered).

    Raises:
      ValueError: as :func:`interaction`, and points of dimension d < 2.
    """
    if getattr(x, "ndim", None) != 2 or getattr(y, "ndim", None) != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(
            "local_interaction expects x (n, d) and y (m, d) with the same d; got "
            f"{getattr(x, 'shape', x)} and {getattr(y, 'shape', y)}")
    d = x.shape[1]
    if getattr(B, "shape", None) != (d, d):
        raise ValueError(f"B must have shape ({d}, {d}); got {getattr(B, 'shape', B)}")
    if y.shape[0] < 1:
        raise ValueError("local_interaction needs at least one key: y has 0 rows")
    if d < 2:  # the space-filling curve orders points in d >= 2
        raise ValueError(f"local_interaction needs points of dimension d >= 2: x has shape "
                         f"{x.shape}")
    _check_real("local_interaction", x=x, y=y, B=B)
    if jnp.ndim(beta) != 0:
        raise ValueError(f"beta must be a scalar (vmap over a stack for several), got shape "
                         f"{jnp.shape(beta)}")
    err, bad = scalar_domain("beta", beta, low=0, what=" (inverse temperature)")
    if err:
        raise ValueError(err)
    tol, capacity = check_local(tol, capacity)
    if max_visited is not None and not 0.0 < float(max_visited) <= 1.0:
        raise ValueError(f"max_visited must be None or in (0, 1], got {max_visited!r}")
    m, stats = _interaction_jit(
        x, y, B, beta if bad is None else jnp.where(bad, 1, beta), normalization="softmax",
        kernel="local", k_block=None, q_block=None, self_keys=y is x, safe=_guard(x.dtype),
        tol=tol, capacity=capacity,
        max_visited=None if max_visited is None else float(max_visited))
    return nan_where(bad, m), (stats if bad is None else stats._replace(
        bound=nan_where(bad, stats.bound), mass=nan_where(bad, stats.mass)))


def _check_real(fn: str, **arrays) -> None:
    """Refuse a complex (or non-numeric) x, y or B by name: its imaginary part would be dropped."""
    for name, a in arrays.items():
        dt = jnp.result_type(a)
        if jnp.issubdtype(dt, jnp.complexfloating) or not (
                jnp.issubdtype(dt, jnp.number) or dt == jnp.bool_):
            raise ValueError(f"{fn}: {name} must hold real numbers, got dtype {dt}")


def _guard(dtype):
    """The bound shift's guard for inputs of ``dtype`` (integers compute in the default float)."""
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(float)
    return float(safe_shift(dtype))


def _clip_blocks(k_block, q_block, n, m):
    """Block sizes as the kernel uses them (``min(block, rows)``): one program a block layout."""
    return (None if k_block is None else max(1, min(k_block, m)),
            None if q_block is None else max(1, min(q_block, n)))


@functools.partial(jax.jit, static_argnames=("normalization", "kernel", "k_block", "q_block",
                                             "self_keys", "safe", "tol", "capacity",
                                             "max_visited"))
def _interaction_jit(x, y, B, beta, *, normalization, kernel, k_block, q_block, self_keys,
                     safe, tol=DEFAULT_TOL, capacity=None, max_visited=None):
    """:func:`interaction` after its checks, one program a call shape."""
    # returns (m, stats), stats None but for the local kernels
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
        return _dense(qx, y, normalization), None

    def blocked_kernel():
        return _blocked_platforms(qx, y, normalization=normalization, k_block=k_block,
                                  q_block=q_block, formulation=None, self_keys=self_keys,
                                  logits=default_cpu_logits(qx.shape[1]), safe=safe)

    if kernel == "blocked":
        return blocked_kernel(), None
    if kernel == "auto_local":
        max_visited = AUTO_LOCAL_MAX_VISITED
    # the keys are their own positions; the queries are ordered by theirs
    return local_attention(qx, y, y, qpos=None if self_keys else x, self_keys=self_keys,
                           tol=tol, capacity=capacity, fallback=blocked_kernel,
                           max_visited=max_visited)


def _dense(qx, y, normalization):
    """The dense kernel: the (n, m) logits at once."""
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

    ``m_i = Σ_j w_ij y_j`` with logits ``l_ij = qx_i · y_j`` (module doc), streamed over key
    blocks by the online softmax of :mod:`._online`.

    Args:
      qx: (n, d) pre-scaled queries.
      y: (m, d) keys, also the values averaged.
      normalization: ``"softmax"`` | ``"unnormalized"`` | ``"hardmax"``.
      k_block: key block size; None: the platform default.
      q_block: query block size; None: the platform default.
      formulation: ``"dot"`` | ``"fused"`` forces one block step (module doc); None picks per
        platform at lowering time.
      self_keys: the keys are the queries' own points (``y[i] = x[i]``, self-attention), so
        ``l_ii = qx_i · y_i`` is a logit of row i (the bound shift's known logit).
      logits: the CPU step with a fixed shift (bound-shifted softmax, unnormalised):
        ``"matmul"`` forms each tile's logits by a matrix product, ``"fused"`` inside the
        exponential's loop; None: :func:`default_cpu_logits` (by d).

    Returns:
      (n, d) array ``m``.

    Raises:
      ValueError: an unknown ``normalization``, ``logits`` or ``formulation``.
    """
    if logits is None:
        logits = default_cpu_logits(qx.shape[1])
    for name, value, choices in (("normalization", normalization, NORMALIZATIONS),
                                 ("logits", logits, LOGITS),
                                 ("formulation", formulation or FORMULATIONS[0], FORMULATIONS)):
        if value not in choices:
            raise ValueError(_choice_error(name, value, choices))
    k_block, q_block = _clip_blocks(k_block, q_block, qx.shape[0], y.shape[0])
    # one program a call shape when called eagerly (inlined under a caller's jit)
    return _blocked_jit(qx, y, normalization=normalization, k_block=k_block, q_block=q_block,
                        formulation=formulation, self_keys=bool(self_keys), logits=logits,
                        safe=_guard(qx.dtype))


@functools.partial(jax.jit, static_argnames=("normalization", "k_block", "q_block",
                                             "formulation", "self_keys", "logits", "safe"))
def _blocked_jit(qx, y, *, normalization, k_block, q_block, formulation, self_keys, logits,
                 safe):
    """:func:`blocked` after its checks, one program a call shape."""
    return _blocked_platforms(qx, y, normalization=normalization, k_block=k_block,
                              q_block=q_block, formulation=formulation, self_keys=self_keys,
                              logits=logits, safe=safe)


def _blocked_platforms(qx, y, *, normalization, k_block, q_block, formulation, self_keys,
                       logits, safe):
    """The blocked kernel with its block step and blocks picked per platform at lowering."""
    if formulation is not None:
        plat = "cpu" if formulation == "dot" else "gpu"
        kb, qb = _blocks(plat, k_block, q_block)
        return _blocked(qx, y, normalization, kb, qb, formulation, self_keys, logits, safe)
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
                              logits=logits, safe=safe),
        default=functools.partial(_blocked, normalization=normalization, k_block=kb_g,
                                  q_block=qb_g, formulation=accel, self_keys=self_keys,
                                  safe=safe),
    )


def _blocks(platform, k_block, q_block):
    """The platform's default blocks where a size is None."""
    kb, qb = DEFAULT_BLOCKS[platform]
    return (kb if k_block is None else k_block), (qb if q_block is None else q_block)


def _blocked(qx, y, normalization, k_block, q_block, formulation, self_keys=False,
             logits="matmul", safe=None):
    """The blocked kernel with one block step: the online core, then the quotient."""
    # Bound shift (CPU "dot" step, softmax): the logits of row i never exceed
    # r_i = |qx_i| · max_j |y_j| (Cauchy–Schwarz); the known logit of row i is l_ii for
    # self-attention, else the row's maximum over the first key block (._online).
    # Unnormalised weights take no shift at all (e^{l_ij} as in the definition).
    n, d = qx.shape
    m = y.shape[0]
    if normalization == "hardmax":
        mode, step = "hardmax", "dot"
    elif normalization == "unnormalized":
        mode, step = "zero", formulation  # e^{l_ij} as in the definition: no shift at all
    else:
        mode, step = ("bound" if formulation == "dot" else "running"), formulation
    r = low = None
    if mode == "bound":
        r = bound(qx, y)
        low = jnp.sum(qx * y, axis=1) if (self_keys and m == n) else None
    # the core's sums: their derivative is a second blocked pass (no N × M array)
    _, acc = sums(qx, y, y, mode=mode, q_block=q_block, k_block=k_block, step=step,
                  logits=logits, r=r, low=low, safe=safe)
    if normalization == "unnormalized":
        return acc[:, :d] / m
    return ratio(acc[:, :d], acc[:, d:])
