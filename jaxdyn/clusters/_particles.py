"""Cluster statistics and interaction energies of particle clouds.

The public names of :mod:`jaxdyn.clusters`, whose docstring states their conventions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_bounds as _check_bounds
from .._checks import check_cloud as _check_cloud
from .._checks import check_dtype as _check_dtype
from .._checks import check_finite as _check_finite
from .._checks import check_same_length as _check_same_length
from .._checks import is_traced as _is_traced
from ..kernels import HIGHEST as _HIGHEST

__all__ = [
    "gram", "pair_fraction", "cluster_labels", "cluster_count", "gram_rank", "cluster_masses",
    "cluster_centres", "span_dimension", "interaction_energy", "log_partition_energy",
    "hitting_times", "merge_events", "MergeEvents", "CLOSURE_MAX_PARTICLES",
]


# ------------------------------------------------------------------ batching over leading axes

def _batched(core, xs, params, core_ndims):
    """Apply ``core(x, *params)`` (x one cloud (N, d)) over the leading axes of ``xs``.

    Each param broadcasts against the leading shape (its trailing ``core_ndims`` axes are its
    own).

    Returns:
      ``core``'s output with the leading axes of ``xs`` in front.

    Raises:
      ValueError: ``xs`` not (..., N, d), or a parameter that does not broadcast.
    """
    xs = jnp.asarray(xs)
    if xs.ndim < 2:
        raise ValueError(f"xs must have shape (..., N, d), got {xs.shape}")
    lead = xs.shape[:-2]
    ps = []
    for p, k in zip(params, core_ndims):
        p = jnp.asarray(p)
        plead = p.shape[:p.ndim - k] if k else p.shape
        full = jnp.broadcast_shapes(lead, plead)
        if full != lead:
            raise ValueError(f"a parameter of leading shape {plead} does not broadcast against "
                             f"the clouds' leading shape {lead}")
        ps.append(jnp.broadcast_to(p, lead + p.shape[p.ndim - k:]).reshape(
            (-1,) + p.shape[p.ndim - k:]))
    flat = xs.reshape((-1,) + xs.shape[-2:])
    out = jax.vmap(core)(flat, *ps)
    return jax.tree.map(lambda a: a.reshape(lead + a.shape[1:]), out)


#: the range of each parameter (besides finite), checked on the host for concrete values:
#: δ ≥ 0 (edges ⟨x_i, x_j⟩ > 1 − δ), β > 0 (the energies divide by it), rtol ≥ 0
_BOUNDS = {"delta": dict(low=0), "beta": dict(low=0, low_open=True), "rtol": dict(low=0)}


def _input_error(xs, **params):
    """What the shared host checks find wrong with the clouds and parameters (None: nothing).

    Clouds (..., N, d) with N, d >= 1, all finite; parameters finite numbers (None skipped),
    δ ≥ 0, β > 0, rtol ≥ 0, and B of shape (..., d, d).
    Shapes are checked for concrete and traced clouds alike; values (NaN, inf) for concrete
    ones only (a traced non-finite value gives NaN or −1, :func:`_flag`).

    Returns:
      The message of the ValueError the caller raises (naming ``xs``, its shape or its first
      non-finite cloud, or the parameter), or None.
    """
    try:
        _check_cloud("xs", xs)
        for name, p in params.items():
            if p is not None and not (_is_traced(p) or np.issubdtype(np.asarray(p).dtype, np.number)):
                return f"{name} must be a number or an array of numbers, got {p!r}"
            _check_finite(name, p)
            if name in _BOUNDS:
                _check_bounds(name, p, **_BOUNDS[name])
        if params.get("B") is not None:
            d, sb = np.shape(xs)[-1], tuple(np.shape(params["B"]))
            if len(sb) < 2 or sb[-2:] != (d, d):
                return (f"B must have shape (d, d) or (..., d, d) with the clouds' d = {d}, "
                        f"got shape {sb}")
    except ValueError as e:
        return str(e)
    return None


def _in_range(name, p):
    """``p``, or NaN where a traced ``p`` lies outside its range (:data:`_BOUNDS`; then flagged)."""
    if p is None or name not in _BOUNDS or not _is_traced(p):
        return p
    b = _BOUNDS[name]
    ok = (p > b["low"]) if b.get("low_open") else (p >= b["low"])
    return jnp.where(ok, p, jnp.nan)


def _flag(out, x, *params):
    """``out`` where the cloud ``x`` and the parameters are finite; else NaN (floats) or −1."""
    ok = jnp.all(jnp.isfinite(x))
    for p in params:
        ok = ok & jnp.all(jnp.isfinite(p))
    bad = jnp.asarray(jnp.nan if jnp.issubdtype(out.dtype, jnp.floating) else -1, out.dtype)
    return jnp.where(ok, out, bad)


@functools.partial(jax.jit, static_argnames=("core", "options", "prepare", "ndims"))
def _per_cloud(xs, *params, core, options=(), prepare=None, ndims=None):
    """The program of every statistic after its host checks: ``core`` on each cloud, flagged.

    Integer clouds are computed in the default float, half-precision ones in float32.
    ``core(x, *p, **dict(options))`` runs on each cloud x (N, d) of ``xs`` with its share of
    the parameters (each broadcast against the leading axes, its trailing ``ndims`` axes its
    own; default scalars); each output leaf goes through :func:`_flag`. ``prepare(xs,
    *params)`` first, when given, returns the clouds and parameters to use. One compiled
    program per statistic, shape and options.

    Returns:
      ``core``'s output with the leading axes of ``xs`` in front.
    """
    xs = jnp.asarray(xs)
    if not jnp.issubdtype(xs.dtype, jnp.floating):  # integers: the default float
        xs = xs.astype(jnp.result_type(float))
    elif jnp.finfo(xs.dtype).bits < 32:  # half precision: computed in float32 (SVD, eigh)
        xs = xs.astype(jnp.float32)
    if prepare is not None:
        xs, *params = prepare(xs, *params)
    kw = dict(options)

    def one(x, *p):
        return jax.tree.map(lambda o: _flag(o, x, *p), core(x, *p, **kw))

    return _batched(one, xs, tuple(params), ndims or (0,) * len(params))


def _gram(x):
    return jnp.matmul(x, x.T, precision=_HIGHEST)


def gram(xs):
    """Gram matrices G_ij = ⟨x_i, x_j⟩.

    Args:
      xs: (..., N, d) clouds.

    Returns:
      (..., N, N) array.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses ``xs`` not (..., N, d)
    with N, d >= 1 (the shape; its values are not checked).
    """
    _check_cloud("xs", xs, finite=False)
    xs = jnp.asarray(xs)
    return jnp.matmul(xs, jnp.swapaxes(xs, -1, -2), precision=_HIGHEST)


# ------------------------------------------------------------------ pair fraction

def _pair_fraction(x, thr, *, include_self):
    n = x.shape[0]
    g = _gram(x)
    iu = jnp.triu(jnp.ones((n, n), bool), k=1)
    count = jnp.sum(iu & (g > thr)).astype(x.dtype)
    if include_self:
        return (2.0 * count + n) / (n * n)
    return count / max(n * (n - 1) // 2, 1)


def pair_fraction(xs, threshold=0.999, *, include_self=False):
    """Fraction of unordered pairs i < j with ⟨x_i, x_j⟩ > ``threshold`` (module doc).

    #{i < j : ⟨x_i, x_j⟩ > threshold} / (N(N−1)/2); N = 1 gives 0 (no pair).

    Args:
      xs: (..., N, d) clouds.
      threshold: the inner-product threshold (broadcasts against ``xs.shape[:-2]``).
      include_self: over all N² ordered pairs, the diagonal counted (each
        ⟨x_i, x_i⟩ = 1 > threshold): (2·count + N)/N² (static).

    Returns:
      Shape ``xs.shape[:-2]``, xs's dtype (NaN for a traced cloud or threshold that is not
      finite).

    Raises:
      ValueError: ``xs`` or ``threshold`` refused by the input checks (module doc), or an
        ``include_self`` that is not True or False.
    """
    if err := _input_error(xs, threshold=threshold):
        raise ValueError(err)
    if not isinstance(include_self, bool):
        raise ValueError(f"include_self must be True or False, got {include_self!r}")
    return _per_cloud(xs, threshold, core=_pair_fraction,
                      options=(("include_self", include_self),))


# ------------------------------------------------------------------ components

#: up to this N the components come from the transitive closure by repeated squaring (a
#: fixed number of matmuls, no data-dependent loop); above it, by min-label propagation
CLOSURE_MAX_PARTICLES = 256


def _labels(x, delta):
    """Component labels: each particle gets the smallest index of its component.

    N <= ``CLOSURE_MAX_PARTICLES``: the reachability matrix R = (I ∨ A)^(2^k) by ⌈log₂ N⌉
    boolean squarings (O(N³ log N), fixed trip count); label_i = min{j : R_ij}. Larger N:
    min-label propagation with pointer jumping in a ``lax.while_loop`` to the fixed point
    (O(N²) a round). Both give the same labels (docs/math.md §F.1).

    Returns:
      (N,) int32 labels.
    """
    n = x.shape[0]
    adj = _gram(x) > 1.0 - delta
    adj = adj | jnp.eye(n, dtype=bool)
    if n <= CLOSURE_MAX_PARTICLES:
        r = adj.astype(x.dtype)
        rounds = max(1, int(np.ceil(np.log2(max(n, 2)))))
        r = jax.lax.fori_loop(0, rounds, lambda _, r: (jnp.matmul(r, r, precision=_HIGHEST) > 0)
                              .astype(r.dtype), r)
        idx = jnp.arange(n, dtype=jnp.int32)
        return jnp.min(jnp.where(r > 0, idx[None, :], n), axis=1).astype(jnp.int32)
    big = jnp.asarray(n, jnp.int32)
    lab0 = jnp.arange(n, dtype=jnp.int32)

    def body(state):
        lab, _ = state
        new = jnp.min(jnp.where(adj, lab[None, :], big), axis=1)
        new = jnp.minimum(new, lab)
        new = new[new]  # pointer jumping: follow the label's own label
        return new, jnp.any(new != lab)

    lab, _ = jax.lax.while_loop(lambda s: s[1], body, (lab0, jnp.asarray(True)))
    return lab


def cluster_labels(xs, delta=1e-4):
    """Connected-component labels of the graph with edges ⟨x_i, x_j⟩ > 1 − δ.

    Args:
      xs: (..., N, d) clouds.
      delta: δ, default 1e-4 (the experiments' ``cluster_delta``); broadcasts against the leading axes.

    Returns:
      (..., N) int32: each particle labelled by the smallest particle index in its component
      (−1 for every particle of a traced cloud, or δ, that is not finite, or a traced δ < 0).

    Raises:
      ValueError: ``xs`` or δ refused by the input checks (module doc).
    """
    if err := _input_error(xs, delta=delta):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("delta", delta), core=_labels)


def _count(x, delta):
    """The number of components: the particles that label their own component."""
    lab = _labels(x, delta)
    return jnp.sum(lab == jnp.arange(x.shape[0], dtype=lab.dtype)).astype(jnp.int32)


def cluster_count(xs, delta=1e-4):
    """Number of connected components of the graph with edges ⟨x_i, x_j⟩ > 1 − δ (module doc).

    Args:
      xs: (..., N, d) clouds.
      delta: δ, default 1e-4 (the experiments' ``cluster_delta``); broadcasts against the leading axes.

    Returns:
      Shape ``xs.shape[:-2]``, int32 (−1 for a traced cloud or δ that is not finite, or a
      traced δ < 0).

    Raises:
      ValueError: ``xs`` or δ refused by the input checks (module doc).
    """
    if err := _input_error(xs, delta=delta):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("delta", delta), core=_count)


def _rank(x, t, rtol, *, has_rtol):
    """The numerical rank of 1[G > t]: singular values above rtol·σ_max (N·eps·σ_max without rtol)."""
    a = (_gram(x) > t).astype(x.dtype)
    s = jnp.linalg.svd(a, compute_uv=False)
    tol = (rtol if has_rtol else x.shape[0] * jnp.finfo(x.dtype).eps) * s[0]
    return jnp.sum(s > tol).astype(jnp.int32)


def gram_rank(xs, threshold=0.9999, *, rtol=None):
    """Numerical rank of the 0/1 matrix 1[⟨x_i, x_j⟩ > threshold] (the rotf count; module doc).

    Args:
      xs: (..., N, d) clouds.
      threshold: the inner-product threshold (broadcasts against ``xs.shape[:-2]``).
      rtol: singular values below ``rtol·σ_max`` count as zero (default N·eps).

    Returns:
      Shape ``xs.shape[:-2]``, int32 (−1 for a traced cloud, threshold or rtol that is not
      finite).

    Raises:
      ValueError: ``xs``, ``threshold`` or ``rtol`` refused by the input checks (module doc).
    """
    if err := _input_error(xs, threshold=threshold, rtol=rtol):
        raise ValueError(err)
    return _per_cloud(xs, threshold, 0.0 if rtol is None else _in_range("rtol", rtol), core=_rank,
                      options=(("has_rtol", rtol is not None),))


def _masses_centres(x, delta):
    n = x.shape[0]
    lab = _labels(x, delta)
    onehot = (lab[:, None] == jnp.arange(n, dtype=lab.dtype)[None, :]).astype(x.dtype)  # (i, k)
    mass = jnp.sum(onehot, axis=0) / n  # (k,)
    s = jnp.matmul(onehot.T, x, precision=_HIGHEST)  # Σ_{i in k} x_i
    norm = jnp.linalg.norm(s, axis=-1, keepdims=True)
    centre = jnp.where(norm > 0, s / jnp.where(norm > 0, norm, 1.0), 0.0)
    order = jnp.argsort(-mass, stable=True)
    return mass[order], centre[order]


def cluster_masses(xs, delta=1e-4):
    """Cluster masses (fractions of the N particles), largest first, padded with zeros to N entries.

    Their number of non-zero entries is :func:`cluster_count`.

    Args:
      xs: (..., N, d) clouds.
      delta: δ, default 1e-4 (the experiments' ``cluster_delta``); broadcasts against the leading axes.

    Returns:
      (..., N) array (NaN for a traced cloud or δ that is not finite, or a traced δ < 0).

    Raises:
      ValueError: ``xs`` or δ refused by the input checks (module doc).
    """
    if err := _input_error(xs, delta=delta):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("delta", delta), core=_masses_centres)[0]


def cluster_centres(xs, delta=1e-4):
    """Cluster centres Σ_{i∈C} x_i / |Σ_{i∈C} x_i| (points of the sphere), in the order of :func:`cluster_masses`.

    Args:
      xs: (..., N, d) clouds.
      delta: δ, default 1e-4 (the experiments' ``cluster_delta``); broadcasts against the leading axes.

    Returns:
      (..., N, d) array, zero rows as padding (NaN for a traced cloud, or δ, that is not
      finite, or a traced δ < 0).

    Raises:
      ValueError: ``xs`` or δ refused by the input checks (module doc).
    """
    if err := _input_error(xs, delta=delta):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("delta", delta), core=_masses_centres)[1]


def _span(x, rtol):
    """The number of singular values of the cloud above ``rtol·σ_max``."""
    s = jnp.linalg.svd(x, compute_uv=False)
    return jnp.sum(s > rtol * s[0]).astype(jnp.int32)


def span_dimension(xs, rtol=1e-3):
    """Dimension of the linear span of the cloud: the singular values of (x_1; …; x_N) above ``rtol·σ_max``.

    1 for one cluster, 2 for two distinct non-antipodal clusters, …; ``rtol`` sets what counts
    as flat.

    Args:
      xs: (..., N, d) clouds.
      rtol: the relative threshold on the singular values.

    Returns:
      Shape ``xs.shape[:-2]``, int32 (−1 for a traced cloud or rtol that is not finite, or a traced rtol < 0).

    Raises:
      ValueError: ``xs`` or ``rtol`` refused by the input checks (module doc).
    """
    if err := _input_error(xs, rtol=rtol):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("rtol", rtol), core=_span)


# ------------------------------------------------------------------ energies

def _logits(x, beta, B):
    return beta * jnp.matmul(jnp.matmul(x, B, precision=_HIGHEST), x.T, precision=_HIGHEST)


def _energy_args(xs, beta, B):
    """The clouds, β and B (default the identity) in the clouds' dtype."""
    xs = jnp.asarray(xs)
    d = xs.shape[-1]
    B = jnp.eye(d, dtype=xs.dtype) if B is None else jnp.asarray(B, xs.dtype)
    return xs, jnp.asarray(beta, xs.dtype), B


def _interaction(x, beta, B):
    """E_β of one cloud."""
    n = x.shape[0]
    return jnp.sum(jnp.exp(_logits(x, beta, B))) / (2.0 * beta * n * n)


def interaction_energy(xs, beta, B=None):
    r"""The interaction energy E_β = (1/(2β N²)) Σ_{i,j} exp(β ⟨Q x_i, K x_j⟩).

    ⟨Q x_i, K x_j⟩ = x_iᵀ B x_j with B = QᵀK (default B = I: Q = K = I).

    Along USA (``normalization="unnormalized"``) and SA (softmax) with V = B symmetric, E_β
    is nondecreasing: USA is N times its gradient flow in the product metric, SA its flow in
    the metric weighted by Z_i/N² (Z_i = Σ_j exp(β x_iᵀBx_j)) — docs/math.md §F.3.

    Args:
      xs: (..., N, d) clouds.
      beta: β, a scalar or broadcastable to ``xs.shape[:-2]``.
      B: (d, d) or (..., d, d) bilinear form QᵀK (default the identity).

    Returns:
      Shape ``xs.shape[:-2]`` (NaN for a traced cloud, β or B that is not finite, or a traced β ≤ 0).

    Raises:
      ValueError: ``xs``, β or B refused by the input checks (module doc).
    """
    if err := _input_error(xs, beta=beta, B=B):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("beta", beta), B, core=_interaction, prepare=_energy_args, ndims=(0, 2))


def _log_partition(x, beta, B):
    """F_β of one cloud, by log-sum-exp."""
    n = x.shape[0]
    lse = jax.scipy.special.logsumexp(_logits(x, beta, B), axis=1) - jnp.log(n)
    return jnp.mean(lse) / beta


def log_partition_energy(xs, beta, B=None):
    r"""The softmax (SA) variant: F_β = (1/(β N)) Σ_i log((1/N) Σ_j exp(β x_iᵀ B x_j)).

    The mean of the particles' log-partition functions (the log of the normalisation of their
    attention rows); F_β ≤ (1/β) log(2β E_β) by Jensen, with equality when all rows have the
    same partition function (one cluster). Computed with log-sum-exp (no overflow).

    Args:
      xs: the clouds, as for :func:`interaction_energy`.
      beta: β, as there.
      B: the bilinear form QᵀK, as there.

    Returns:
      Shape ``xs.shape[:-2]``, with the same NaN convention.

    Raises:
      ValueError: the input errors of :func:`interaction_energy`.
    """
    if err := _input_error(xs, beta=beta, B=B):
        raise ValueError(err)
    return _per_cloud(xs, _in_range("beta", beta), B, core=_log_partition, prepare=_energy_args, ndims=(0, 2))


# ------------------------------------------------------------------ merges and plateaus

def hitting_times(ts, counts, levels):
    r"""The first saved time at which the cluster count is ≤ each level (traceable, batched).

    With saves at t_0 < t_1 < …, a merge from above ``k`` to ≤ ``k`` that happens at time τ
    is reported as the first saved t_s ≥ τ: τ ∈ (t_{s−1}, t_s] — within one save interval.
    The length of the plateau at exactly k clusters is
    ``hitting(k − 1) − hitting(k)`` (inf when the count never falls below k). The fixed-shape
    counterpart of :func:`merge_events`.

    Args:
      ts: (S,) saved times.
      counts: (..., S) cluster counts at those times.
      levels: (L,) integer levels.

    Dtypes: float32 or float64, float16 or bfloat16, integers (counts usually are; integer
    times are returned in JAX's default float); complex is refused (a TypeError naming the
    parameter).

    Returns:
      (..., L) times; +inf where the count never reaches the level; NaN for a trajectory
      whose counts hold a NaN or inf.

    Raises:
      ValueError: ``ts`` not 1-D and non-empty, ``counts`` whose last axis is not as long as
        ``ts`` (the message names both lengths), or ``levels`` not 1-D (shapes: checked under
        ``jax.jit`` too); concrete ``ts`` or ``levels`` that are not finite.
    """
    for name, a in (("ts", ts), ("counts", counts), ("levels", levels)):
        _check_dtype(name, a, half=True, fn="hitting_times")
    _check_same_length("ts", ts, "counts", counts)
    if np.shape(ts)[0] < 1:
        raise ValueError("ts must hold at least one saved time, got an empty array")
    if np.ndim(levels) != 1:
        raise ValueError(f"levels must be a 1-D array of integer levels, got shape "
                         f"{tuple(np.shape(levels))}")
    _check_finite("ts", ts)
    _check_finite("levels", levels)
    return _hitting_jit(ts, counts, levels)


@jax.jit
def _hitting_jit(ts, counts, levels):
    """:func:`hitting_times` after its checks."""
    ts = jnp.asarray(ts)
    counts = jnp.asarray(counts)
    levels = jnp.asarray(levels)
    below = counts[..., None, :] <= levels[:, None]  # (..., L, S)
    first = jnp.argmax(below, axis=-1)
    hit = jnp.any(below, axis=-1)
    dtype = ts.dtype if jnp.issubdtype(ts.dtype, jnp.floating) else jnp.result_type(float)
    out = jnp.where(hit, ts.astype(dtype)[first], jnp.asarray(jnp.inf, dtype))
    if jnp.issubdtype(counts.dtype, jnp.inexact):  # a NaN/inf count: the row's times are NaN
        out = jnp.where(jnp.all(jnp.isfinite(counts), axis=-1)[..., None], out, jnp.nan)
    return out


class MergeEvents:
    """Merges and plateaus of one trajectory (:func:`merge_events`; NumPy arrays on the host).

    Args:
      times: see Attributes.
      before: see Attributes.
      from_count: see Attributes.
      to_count: see Attributes.
      plateau_counts: see Attributes.
      plateau_start: see Attributes.
      plateau_end: see Attributes.

    Attributes:
      times: (M,) first saved time after each drop of the count (the drop happened in
        (``before[m]``, ``times[m]``]).
      before: (M,) the saved time just before each drop.
      from_count, to_count: (M,) the count before and after each drop.
      plateau_counts: (M + 1,) the count on each plateau (first: the initial count).
      plateau_start, plateau_end: (M + 1,) the plateau's saved start and the next drop's
        time (the last plateau ends at the last saved time, ``open_end`` True).
      plateau_length: ``plateau_end − plateau_start``.
    """

    def __init__(self, times, before, from_count, to_count, plateau_counts, plateau_start,
                 plateau_end):
        self.times, self.before = times, before
        self.from_count, self.to_count = from_count, to_count
        self.plateau_counts = plateau_counts
        self.plateau_start, self.plateau_end = plateau_start, plateau_end
        self.plateau_length = plateau_end - plateau_start
        self.open_end = True

    def __repr__(self):
        ev = ", ".join(f"{a}→{b} at t∈({s:.4g}, {t:.4g}]" for a, b, s, t in
                       zip(self.from_count, self.to_count, self.before, self.times))
        return f"MergeEvents({ev or 'no merge'})"


def merge_events(ts, counts, *, monotone=True):
    """Merge times and plateaus of one trajectory, on the host (NumPy; variable-length output).

    As many merges as the trajectory has: a data-dependent length, hence not traceable
    (:func:`hitting_times` is the fixed-shape counterpart that runs under ``jax.jit``).

    Args:
      ts: (S,) increasing saved times (concrete).
      counts: (S,) cluster counts at those times (:func:`cluster_count` of the saved frames).
      monotone: count a drop only when the running minimum of the count drops (a count that
        flickers up for a frame, a pair near the threshold, is not a split then a merge).
        False: every decrease of the raw count is a drop.

    Returns:
      :class:`MergeEvents`. Because only the saved frames are seen, each merge time is known
      to within the save interval that contains it; the plateaus' lengths are exact up to
      one save interval at each end, whatever the saving frequency.

    Raises:
      ValueError: traced inputs, ``ts`` and ``counts`` not 1-D of one non-zero length, or
        ``ts`` not strictly increasing, or ``ts`` or ``counts`` not finite.
    """
    if any(isinstance(a, jax.core.Tracer) for a in (ts, counts)):
        raise ValueError("merge_events returns as many merges as there are (a data-dependent "
                         "length) and runs on the host: call it on concrete arrays, or use "
                         "hitting_times under jit/vmap")
    ts = np.asarray(ts, float)
    c = np.asarray(counts)
    if ts.ndim != 1 or c.shape != ts.shape or ts.size == 0:
        raise ValueError(f"ts and counts must be 1-D arrays of the same non-zero length, got "
                         f"{ts.shape} and {c.shape}")
    _check_finite("ts", ts)
    _check_finite("counts", c)
    if np.any(np.diff(ts) <= 0):
        raise ValueError("ts must be strictly increasing")
    if monotone:
        c = np.minimum.accumulate(c)
    drop = np.flatnonzero(c[1:] < c[:-1]) + 1
    times, before = ts[drop], ts[drop - 1]
    from_c, to_c = c[drop - 1], c[drop]
    p_counts = np.concatenate([[c[0]], to_c])
    p_start = np.concatenate([[ts[0]], times])
    p_end = np.concatenate([times, [ts[-1]]])
    return MergeEvents(times, before, from_c, to_c, p_counts, p_start, p_end)
