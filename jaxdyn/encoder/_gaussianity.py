"""How Gaussian is a cloud of hidden states? Layer-by-layer measurement with noise floors.

Paper B's experiment: feed i.i.d. Gaussian token embeddings ``h0 ~ N(0, s² I)`` through an
encoder and measure, after each layer, how far the cloud of hidden states (all tokens of
all sequences pooled: X ∈ R^{n×d}) is from the Gaussian ``N(m, Σ)`` with the same mean and
covariance (``m``, ``Σ``: the empirical moments of X, ``Σ = (1/n) Σ_i (x_i − m)(x_i − m)ᵀ``).

Metrics (per layer; θ_1..θ_K are random unit directions, K = ``n_dirs``, shared by all
layers and by the noise floor; Y ~ N(m, Σ) is a Gaussian reference sample of size n):

- ``sw2``: sliced W2 between X and Y, normalised by the scale ``sqrt(tr Σ / d)``:
  ``SW2² = (1/K) Σ_k W2²(θ_kᵀX, θ_kᵀY)``, 1-D W2 by sorting (equal sizes).
- ``skew``, ``kurt``: mean over k of |skewness| and |excess kurtosis| of the projections
  θ_kᵀX (sample moments of the standardised projection: g1 = E z³, g2 = E z⁴ − 3).
- ``skew_pc``, ``kurt_pc``: the same along the top ``n_pc`` principal axes of Σ (random
  directions of a high-dimensional cloud look Gaussian even when the cloud is not — the
  Diaconis–Freedman effect — so structured non-Gaussianity shows up here first).
- ``radial_w2``: 1-D W2 between the radii ``|x_i − m|`` and ``|y_i − m|``, divided by
  ``sqrt(tr Σ)``. A post-LN hidden state h has ``|(h − β)/γ| = sqrt(d)`` exactly (up to
  eps): the cloud lies on an ellipsoid, which random 1-D projections cannot see.
- ``erank``: effective rank ``exp(−Σ p_i log p_i)``, ``p_i = λ_i / Σ_j λ_j`` (λ the
  eigenvalues of Σ; Roy & Vetterli 2007); ``pr``: participation ratio ``(Σλ)² / Σλ²``.
- ``scale``: ``sqrt(tr Σ / d)`` (descriptive).
- ``bures``: Bures–Wasserstein distance between ``N(m_l, Σ_l)`` and ``N(m_{l+1}, Σ_{l+1})``
  of consecutive layers (length L, entry l is the step l → l+1),
  ``W2² = |m0 − m1|² + tr(Σ0 + Σ1 − 2 (Σ1^{1/2} Σ0 Σ1^{1/2})^{1/2})``
  (``jaxdyn.distances.bures_w2``, eigh-based square roots); ``bures_rel``: the same
  divided by ``sqrt((tr Σ_l + tr Σ_{l+1}) / 2)``.

Noise floor: each metric is recomputed, by the very same procedure, on ``n_floor`` exact
Gaussian samples ``G_r ~ N(m, Σ)`` of the same size n (and the same directions). A cloud
is "Gaussian at this resolution" when its metric lies within a few floor standard
deviations of the floor mean (``GaussianityProfile.zscore``). For ``bures`` the floor of
the step l → l+1 combines, in quadrature, the Bures distances between the moments of two
independent samples ``G_r``, ``G_{r+1}`` of layer l and of layer l+1 (the level below which
a change of layer moments cannot be told from sampling noise).

Caveats. (0) The ``bures`` floor is computed from *independent* samples; consecutive
layers are the same tokens mapped, whose sampling errors are positively correlated, so
this floor is conservative (a small layer-to-layer change can sit below it).
(1) ``erank``/``pr`` are descriptors, not Gaussianity tests: their floor's spread is the
sampling noise, but its mean is biased low by O(d/n) relative (sampling from the
already-sampled Σ spreads the spectrum once more; 2 % at d = 384, n = 8192).
(2) Tokens of one sequence are dependent after attention; the floor assumes i.i.d. points.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import check_bounds, check_integer, nan_where, scalar_domain
from ..distances import bures_w2, sqrtm_psd

_HIGHEST = jax.lax.Precision.HIGHEST

# Metrics that test Gaussianity: for an exact Gaussian cloud they sit at their floor.
GAUSSIANITY_METRICS = ("sw2", "skew", "kurt", "skew_pc", "kurt_pc", "radial_w2")
# Descriptors: their floor gives the sampling spread (and, for bures, the detection level).
CLOUD_METRICS = ("sw2", "skew", "kurt", "skew_pc", "kurt_pc", "radial_w2", "erank", "pr", "scale")
STEP_METRICS = ("bures", "bures_rel")
METRICS = CLOUD_METRICS + STEP_METRICS


# ---------------------------------------------------------------------------------------
# Building blocks (pure functions on one cloud)


def moments(x: Float[Array, "n d"]):
    """Empirical mean and (biased, 1/n) covariance of a cloud."""
    m = jnp.mean(x, axis=0)
    xc = x - m
    cov = jnp.matmul(xc.T, xc, precision=_HIGHEST) / x.shape[0]
    return m, 0.5 * (cov + cov.T)


def effective_rank(lam: Float[Array, " d"]):
    """``(exp entropy, participation ratio)`` of a PSD spectrum λ (negatives clipped to 0)."""
    lam = jnp.clip(lam, 0.0)
    p = lam / jnp.sum(lam)
    ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
    # a NaN spectrum gives NaN (the where above read it as 0: erank 1, "full collapse")
    ent = jnp.where(jnp.any(jnp.isnan(lam)), jnp.nan, ent)
    return jnp.exp(ent), jnp.sum(lam) ** 2 / jnp.sum(lam**2)


def sort_columns(a: Float[Array, "n k"]) -> Float[Array, "n k"]:
    """Sort each column ascending (equal to ``jnp.sort(a, axis=0)`` for non-NaN input).

    XLA's CPU sort with a floating-point comparator is several times slower than with an
    integer one, so the floats are mapped to order-preserving integers (IEEE-754 bits,
    with the magnitude bits flipped for negatives), sorted, and mapped back.

    Args:
      a: (n, k) array.

    Returns:
      The columns sorted, (n, k).
    """
    itype = {4: jnp.int32, 8: jnp.int64}.get(jnp.dtype(a.dtype).itemsize)
    if itype is None:
        return jnp.sort(a, axis=0)
    flip = jnp.array(np.iinfo(itype).max, itype)
    bits = jax.lax.bitcast_convert_type(a, itype)
    keys = jnp.where(bits < 0, bits ^ flip, bits)
    keys = jax.lax.sort(keys, dimension=0, is_stable=False)
    return jax.lax.bitcast_convert_type(jnp.where(keys < 0, keys ^ flip, keys), a.dtype)


def sliced_w2(x: Float[Array, "n d"], y: Float[Array, "n d"], dirs: Float[Array, "d k"]):
    """Sliced W2 between two equal-size clouds over the given unit directions.

    ``SW2² = (1/k) Σ_j W2²(θ_jᵀx, θ_jᵀy)``; each 1-D W2 pairs sorted projections.

    Args:
      x: (n, d) cloud.
      y: (n, d) cloud.
      dirs: (d, k) unit directions θ_j.

    Returns:
      SW2, a scalar.

    Raises:
      ValueError: for clouds of different shapes.
    """
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape (n, d), got {x.shape} and {y.shape}")
    px = sort_columns(jnp.matmul(x, dirs, precision=_HIGHEST))
    py = sort_columns(jnp.matmul(y, dirs, precision=_HIGHEST))
    return jnp.sqrt(jnp.mean(jnp.square(px - py)))


def projected_moments(xc: Float[Array, "n d"], dirs: Float[Array, "d k"]):
    """Sample skewness g1 and excess kurtosis g2 of the projections of a *centred* cloud.

    ``z = θᵀx / sqrt(mean((θᵀx)²))``, ``g1 = mean z³``, ``g2 = mean z⁴ − 3``.

    Args:
      xc: (n, d) centred cloud.
      dirs: (d, k) unit directions.

    Returns:
      ``(g1, g2)``, shape (k,) each.
    """
    p = jnp.matmul(xc, dirs, precision=_HIGHEST)
    z = p / jnp.sqrt(jnp.mean(jnp.square(p), axis=0))
    return jnp.mean(z**3, axis=0), jnp.mean(z**4, axis=0) - 3.0


def random_directions(key, d: int, k: int, dtype=jnp.float32) -> Float[Array, "d k"]:
    """The columns of a (d, k) array: k i.i.d. uniform unit vectors in R^d."""
    g = jax.random.normal(key, (d, k), dtype)
    return g / jnp.linalg.norm(g, axis=0, keepdims=True)


def _cloud_stats(x, key, dirs, n_pc):
    """All per-cloud metrics of ``x`` (n, d) with its Gaussian reference drawn from ``key``."""
    n, d = x.shape
    m, cov = moments(x)
    lam, u = jnp.linalg.eigh(cov)
    lam = jnp.clip(lam, 0.0)
    half = jnp.matmul(u * jnp.sqrt(lam), u.T, precision=_HIGHEST)
    z = jax.random.normal(key, (n, d), x.dtype)
    yc = jnp.matmul(z, half, precision=_HIGHEST)  # Y − m ~ N(0, Σ)
    xc = x - m
    tr = jnp.sum(lam)
    scale = jnp.sqrt(tr / d)
    skew, kurt = projected_moments(xc, dirs)
    pcs = u[:, d - n_pc :]  # eigh sorts ascending: the last columns are the top axes
    skew_pc, kurt_pc = projected_moments(xc, pcs)
    rx = jnp.sort(jnp.linalg.norm(xc, axis=1))
    ry = jnp.sort(jnp.linalg.norm(yc, axis=1))
    erank, pr = effective_rank(lam)
    stats = dict(
        sw2=sliced_w2(xc, yc, dirs) / scale,
        skew=jnp.mean(jnp.abs(skew)),
        kurt=jnp.mean(jnp.abs(kurt)),
        skew_pc=jnp.mean(jnp.abs(skew_pc)),
        kurt_pc=jnp.mean(jnp.abs(kurt_pc)),
        radial_w2=jnp.sqrt(jnp.mean(jnp.square(rx - ry))) / jnp.sqrt(tr),
        erank=erank,
        pr=pr,
        scale=scale,
    )
    return stats, m, cov


def _bures_pairs(m0, s0, m1, s1):
    """Bures W2 of a batch of pairs, one pair at a time (``lax.map``, not a batched eigh).

    jaxlib 0.10's CPU LAPACK kernels run a *batched* eigh through ``ParallelBatchMap`` on
    XLA's intra-op thread pool and block that pool thread until the batch is done; two
    batched eighs in flight at once (independent ops of one jitted function) then wait on
    each other when the pool has two threads (a 2-core machine): a deadlock. Unbatched
    eighs inside a sequential loop avoid it.

    Returns:
      The batch of distances.
    """
    return jax.lax.map(lambda a: bures_w2(*a).value, (m0, s0, m1, s1))


@eqx.filter_jit
def _profile(h, key, n_dirs: int, n_floor: int, n_pc: int):
    """The metrics of the clouds h (L1, n, d) and their floors, as dicts of arrays.

    One loop over the L1 × (1 + n_floor) clouds (replicate 0: the data; replicate r ≥ 1:
    an exact Gaussian sample with the data's moments), so that ``_cloud_stats`` is traced
    once and one cloud at a time is in memory.

    Returns:
      ``(values, floors)``.
    """
    L1, n, d = h.shape
    R = n_floor + 1
    k_dirs, k_clouds = jax.random.split(key)
    dirs = random_directions(k_dirs, d, n_dirs, h.dtype)
    m_data, cov_data = jax.vmap(moments)(h)
    half_data = jax.lax.map(sqrtm_psd, cov_data)  # not vmap: see _bures_pairs

    def one_cloud(args):
        layer, r, k = args
        k_sample, k_ref = jax.random.split(k)
        gauss = m_data[layer] + jnp.matmul(
            jax.random.normal(k_sample, (n, d), h.dtype), half_data[layer], precision=_HIGHEST
        )
        x = jnp.where(r == 0, h[layer], gauss)
        stats, m, cov = _cloud_stats(x, k_ref, dirs, n_pc)
        return stats, m, cov

    layers = jnp.repeat(jnp.arange(L1), R)
    reps = jnp.tile(jnp.arange(R), L1)
    keys = jax.random.split(k_clouds, L1 * R)
    stats, ms, covs = jax.lax.map(one_cloud, (layers, reps, keys))
    stats = {k: v.reshape(L1, R) for k, v in stats.items()}
    ms, covs = ms.reshape(L1, R, d), covs.reshape(L1, R, d, d)

    values = {k: v[:, 0] for k, v in stats.items()}
    floors = {k: v[:, 1:].T for k, v in stats.items()}  # (n_floor, L1)

    # All Bures distances in one sequential loop: the L1 − 1 steps l → l+1 of the data,
    # then, per layer, the sampling-noise Bures between independent Gaussian samples r and
    # r+1 (cyclic).
    dm, dc = ms[:, 0], covs[:, 0]
    fm, fc = ms[:, 1:], covs[:, 1:]
    flat = lambda a: a.reshape(L1 * n_floor, *a.shape[2:])  # noqa: E731
    b = _bures_pairs(
        jnp.concatenate([dm[:-1], flat(fm)]),
        jnp.concatenate([dc[:-1], flat(fc)]),
        jnp.concatenate([dm[1:], flat(jnp.roll(fm, 1, axis=1))]),
        jnp.concatenate([dc[1:], flat(jnp.roll(fc, 1, axis=1))]),
    )
    tr = jnp.trace(dc, axis1=-2, axis2=-1)
    values["bures"] = b[: L1 - 1]
    values["bures_rel"] = values["bures"] / jnp.sqrt(0.5 * (tr[:-1] + tr[1:]))
    # Floor of the step l → l+1: layers l and l+1 combined in quadrature, (n_floor, L1 − 1).
    fb = b[L1 - 1 :].reshape(L1, n_floor).T
    floors["bures"] = jnp.sqrt(0.5 * (fb[:, :-1] ** 2 + fb[:, 1:] ** 2))
    ftr = jnp.trace(fc, axis1=-2, axis2=-1).T
    floors["bures_rel"] = floors["bures"] / jnp.sqrt(0.5 * (ftr[:, :-1] + ftr[:, 1:]))
    return values, floors


class GaussianityProfile(eqx.Module):
    """Per-layer Gaussianity metrics and their Monte-Carlo noise floors.

    ``values[name]``: shape (L+1,) for the per-cloud metrics (index 0 is the input),
    (L,) for ``bures``/``bures_rel`` (entry l is the step l → l+1).
    ``floors[name]``: (n_floor, ...) the same metric on exact Gaussian samples.

    Attributes:
      values: the metrics, by name.
      floors: the metrics of the Gaussian replicates, by name.
      n_points: n, the points a cloud.
      dim: d.
      n_dirs: the random directions of the sliced metrics.
    """

    values: dict[str, Array]
    floors: dict[str, Array]
    n_points: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    n_dirs: int = eqx.field(static=True)

    @property
    def floor_mean(self) -> dict[str, Array]:
        """The floors' means, by name."""
        return {k: jnp.mean(v, axis=0) for k, v in self.floors.items()}

    @property
    def floor_std(self) -> dict[str, Array]:
        """The floors' standard deviations (ddof 1), by name."""
        return {k: jnp.std(v, axis=0, ddof=1) for k, v in self.floors.items()}

    def zscore(self, name: str) -> Array:
        """``(value − floor mean) / floor std``: how many floor deviations above Gaussian.

        A Gaussianity test for the names in ``GAUSSIANITY_METRICS``; for the descriptors
        (``erank``, ``pr``: floor mean biased, see the module docstring) only a scale.

        Args:
          name: a metric.

        Returns:
          The z-scores, per layer.

        Raises:
          ValueError: for an unknown metric.
        """
        if name not in self.values:
            raise ValueError(f"name must be one of {sorted(self.values)}, got {name!r}")
        return (self.values[name] - self.floor_mean[name]) / self.floor_std[name]

    def to_dict(self) -> dict:
        """Plain nested lists (JSON-ready): ``{name: {value, floor_mean, floor_std}}``."""
        fm, fs = self.floor_mean, self.floor_std
        return {
            k: {
                "value": np.asarray(self.values[k]).tolist(),
                "floor_mean": np.asarray(fm[k]).tolist(),
                "floor_std": np.asarray(fs[k]).tolist(),
            }
            for k in self.values
        }

    def table(
        self,
        names: Sequence[str] = ("sw2", "skew", "kurt", "kurt_pc", "radial_w2", "erank", "bures_rel"),
    ) -> str:
        """A text table: one row per layer, ``value (floor mean ± floor std)`` per metric."""
        fm, fs = self.floor_mean, self.floor_std
        L1 = self.values["sw2"].shape[0]
        rows = ["layer  " + "  ".join(f"{n:>24s}" for n in names)]
        for layer in range(L1):
            cells = []
            for nm in names:
                off = 1 if nm in STEP_METRICS else 0
                i = layer - off
                if i < 0:
                    cells.append(f"{'-':>24s}")
                    continue
                v, a, b = (float(self.values[nm][i]), float(fm[nm][i]), float(fs[nm][i]))
                cells.append(f"{v:9.4f} ({a:7.4f}±{b:6.4f})")
            rows.append(f"{layer:5d}  " + "  ".join(cells))
        return "\n".join(rows)


@contextlib.contextmanager
def limit_blas_threads(n: int = 1):
    """Temporarily cap the threads of every OpenBLAS loaded in this process (best effort).

    JAX's CPU ``eigh`` calls LAPACK from SciPy's OpenBLAS, whose own thread pool competes
    with XLA's and slows a small ``eigh`` many times over on a machine with few cores. Linux
    only (reads /proc/self/maps); elsewhere it does nothing.
    Setting ``OPENBLAS_NUM_THREADS=1`` before Python starts has the same effect.
    """
    try:  # JAX loads SciPy's LAPACK (and its OpenBLAS) lazily, at the first eigh
        import scipy.linalg.cython_lapack  # noqa: F401
    except ImportError:
        pass
    found = []
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and ".so" in ln})
    except OSError:
        paths = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            get = getattr(lib, prefix + "_get_num_threads", None)
            put = getattr(lib, prefix + "_set_num_threads", None)
            if get is not None and put is not None:
                found.append((int(get()), put))
                break
    for _, put in found:
        put(int(n))
    try:
        yield
    finally:
        for old, put in found:
            put(old)


def _as_stack(hidden_states, mask):
    """The hidden states as one (L1, n, d) array, tokens pooled (a ValueError if they cannot be)."""
    if isinstance(hidden_states, (list, tuple)):
        if not hidden_states:
            raise ValueError("hidden_states is empty")
        shapes = {tuple(np.shape(h)) for h in hidden_states}
        if len(shapes) != 1:
            raise ValueError(f"hidden_states must all have one shape, got {sorted(shapes)}")
        h = jnp.stack([jnp.asarray(a) for a in hidden_states])
    else:
        h = jnp.asarray(hidden_states)
    if h.ndim == 4:  # (L1, batch, seq, d)
        L1, b, s, d = h.shape
        h = h.reshape(L1, b * s, d)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.shape != (b, s):
                raise ValueError(f"mask must have shape (batch, seq) = {(b, s)}, got {mask.shape}")
            h = h[:, np.flatnonzero(mask.reshape(-1))]
    elif h.ndim == 3:
        if mask is not None:
            raise ValueError("mask needs hidden states of shape (layers, batch, seq, d)")
    else:
        raise ValueError(
            "hidden_states must be a list of (batch, seq, d) or (n, d) arrays, or a stacked "
            f"array (layers, batch, seq, d) or (layers, n, d); got shape {tuple(h.shape)}"
        )
    if not jnp.issubdtype(h.dtype, jnp.floating):
        raise ValueError(f"hidden_states must be floating point, got {h.dtype}")
    return h


def gaussianity_profile(
    hidden_states,
    key: jax.Array,
    *,
    n_dirs: int = 128,
    n_floor: int = 8,
    n_pc: int = 8,
    mask=None,
) -> GaussianityProfile:
    """Layer-by-layer distance of the pooled hidden-state cloud from its moment-matched Gaussian.

    With Monte-Carlo noise floors (metrics: see the module docstring). All tokens are pooled
    into one cloud of n = batch·seq points (only those with a true ``mask`` entry when a
    (batch, seq) mask is given). Computation in the input dtype; the same key gives the same
    result. Host-driven (concrete inputs: it sizes the program and caps the BLAS threads).

    Args:
      hidden_states: the list returned by ``encode`` (L + 1 arrays (batch, seq, d)), any list
        of (n, d) clouds, or a stacked array with a leading layer axis.
      key: a JAX PRNG key.
      n_dirs: random directions of the sliced metrics (>= 1).
      n_floor: Gaussian replicates for the floor (>= 3).
      n_pc: principal axes of ``skew_pc``/``kurt_pc`` (in [1, d]).
      mask: None, or (batch, seq) bool: the tokens to pool.

    Returns:
      A :class:`GaussianityProfile`.

    Raises:
      ValueError: for n_floor < 3, n_pc outside [1, d], n_dirs < 1 or fewer than 4 points.
    """
    h = _as_stack(hidden_states, mask)
    L1, n, d = h.shape
    if n_floor < 3:
        # the Bures floor pairs the Gaussian replicates cyclically: with 2 both pairs are the
        # same pair (the distance is symmetric), a floor with no spread (z-scores of 1e5)
        raise ValueError(f"n_floor must be >= 3 (a floor needs a spread; the Bures floor pairs "
                         f"replicates cyclically), got {n_floor}")
    if not 1 <= n_pc <= d:
        raise ValueError(f"n_pc must be in [1, d={d}], got {n_pc}")
    if n_dirs < 1:
        raise ValueError(f"n_dirs must be >= 1, got {n_dirs}")
    if n < 4:
        raise ValueError(f"need at least 4 points per layer, got n={n}")
    with limit_blas_threads(1):
        values, floors = jax.block_until_ready(_profile(h, key, int(n_dirs), int(n_floor), int(n_pc)))
    return GaussianityProfile(values=values, floors=floors, n_points=n, dim=d, n_dirs=n_dirs)


# ---------------------------------------------------------------------------------------
# Inputs and controls


def gaussian_tokens(key, batch: int, seq: int, d: int, scale: float = 1.0, dtype=jnp.float32):
    """Token embeddings ``h0 ~ N(0, scale² I_d)`` i.i.d.

    Args:
      key: a JAX PRNG key.
      batch: sequences.
      seq: tokens a sequence.
      d: the width.
      scale: s, finite and > 0. A traced value outside the domain gives NaN.
      dtype: the floating dtype.

    Returns:
      (batch, seq, d) array.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses batch, seq or d not an
    integer >= 1, or a concrete scale that is not a finite number > 0.
    """
    shape = tuple(check_integer(n, v, minimum=1) for n, v in
                  (("batch", batch), ("seq", seq), ("d (the width)", d)))
    check_bounds("scale", scale, low=0, low_open=True)
    bad = scalar_domain("scale", scale, low=0, low_open=True)[1]
    return nan_where(bad, scale * jax.random.normal(key, shape, dtype))


_CONTROL_KINDS = ("cube", "relu", "split")


@eqx.filter_jit
def nongaussian_stack(h0, key, *, n_layers: int = 6, kind: str = "cube") -> list[Array]:
    """A deliberately non-Gaussian "encoder" for the control: ``[h_0, h_1, ..., h_L]``.

    Layer l applies a fixed non-Gaussian map *once* to the Gaussian input, after a random
    rotation R_l (orthogonal) or along a random unit vector u_l, and restores the input's
    root-mean-square value (σ):

    - ``"cube"``:  h_l = c (h_0 R_l)³ elementwise (heavy tails: excess kurtosis 43.2 per
      coordinate; about 3·43.2/(d+2) along a random direction);
    - ``"relu"``:  h_l = c relu(h_0 R_l) (skewed; half the mass on coordinate hyperplanes);
    - ``"split"``: h_l = c (h_0 + 2σ sign(⟨h_0, u_l⟩) u_l) (two clusters along u_l).

    The maps do not compound across layers (repeated cubes would collapse the cloud onto
    one axis within a few layers), so every layer is a known, equally non-Gaussian cloud:
    a positive control for ``gaussianity_profile``. Jitted.

    Args:
      h0: (..., d) Gaussian input.
      key: a JAX PRNG key.
      n_layers: L.
      kind: ``"cube"`` | ``"relu"`` | ``"split"``.

    Returns:
      The list of L + 1 arrays.

    Raises:
      ValueError: for an unknown kind or an ``n_layers`` that is not an integer >= 0.
    """
    check_integer("n_layers", n_layers, minimum=0)
    if kind not in _CONTROL_KINDS:
        raise ValueError(f"kind must be one of {_CONTROL_KINDS}, got {kind!r}")
    h0 = jnp.asarray(h0)
    d = h0.shape[-1]
    sigma = jnp.sqrt(jnp.mean(jnp.square(h0)))
    out = [h0]
    for layer in range(n_layers):
        k = jax.random.fold_in(key, layer)
        if kind == "split":
            u = random_directions(k, d, 1, h0.dtype)[:, 0]
            h = h0 + 2.0 * sigma * jnp.sign(h0 @ u)[..., None] * u
        else:
            q, r = jnp.linalg.qr(jax.random.normal(k, (d, d), h0.dtype))
            rot = q * jnp.sign(jnp.diagonal(r))
            hr = jnp.matmul(h0, rot, precision=_HIGHEST)
            h = hr**3 if kind == "cube" else jax.nn.relu(hr)
        out.append(h * (sigma / jnp.sqrt(jnp.mean(jnp.square(h)))))
    return out


def measure_gaussianity(
    params,
    cfg,
    key: jax.Array,
    *,
    scales: Sequence[float] = (0.5, 1.0, 2.0),
    batch: int = 64,
    seq: int = 128,
    **profile_kw,
) -> dict[float, GaussianityProfile]:
    """Paper B's experiment on a BERT encoder: the hidden states' profile for each input scale.

    For each input scale s, feed ``h0 = s·Z`` (Z ~ N(0, I) i.i.d., one draw shared by all
    scales) into layer 0 and profile the hidden states.

    Args:
      params: the encoder's :class:`BertParams`.
      cfg: its :class:`BertConfig`.
      key: a JAX PRNG key.
      scales: the input scales s.
      batch: sequences.
      seq: tokens a sequence.
      **profile_kw: options of :func:`gaussianity_profile`.

    Returns:
      ``{s: GaussianityProfile}``.
    """
    from ._bert import encode

    dtype = params.layers.wq.dtype
    k_in, k_prof = jax.random.split(key)
    z = gaussian_tokens(k_in, batch, seq, cfg.hidden_size, 1.0, dtype)
    out = {}
    for s in scales:
        hs = encode(params, cfg, (s * z).astype(dtype))
        out[float(s)] = gaussianity_profile(hs, k_prof, **profile_kw)
    return out
