"""Sampling on S^{d-1}: uniform, von Mises–Fisher, and a mixture of the two.

Uniform; von Mises–Fisher vMF(μ, κ) (Wood 1994 rejection sampler); and a mixture
``(1 − w)·uniform + w·vMF(μ, κ)``, whose density is strictly positive and Lipschitz (Paper A,
Assumption 3) while still far from uniform. The samplers are jittable and vmappable over their
keys (and their array parameters); their random streams are JAX's, unchanged by the bucketing of
:func:`normal_rows`.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ._geometry import _normalize as normalize, tangent_project


def _check_n_d(n, d):
    """Refuse a sample size or dimension that is not an integer in range (a ValueError)."""
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (number of particles) must be an integer >= 1, got {n!r}")
    if not isinstance(d, (int, np.integer)) or d < 2:
        raise ValueError(f"d (ambient dimension of S^(d-1)) must be an integer >= 2, got {d!r}")


def _bucket_rows(n: int) -> int:
    """The row count a sampling program is compiled for: the next power of two (at least 64)."""
    return max(64, 1 << (int(n) - 1).bit_length())


def _prefix_stable() -> bool:
    """Whether ``jax.random.normal(key, (R, d))[:n] == jax.random.normal(key, (n, d))`` bit for bit.

    True of the partitionable threefry (each number depends on the key and its flat index only),
    JAX's default; not of the older, non-partitionable stream, nor of other generators.

    Returns:
      A Python bool.
    """
    return bool(jax.config.jax_threefry_partitionable) and \
        jax.config.jax_default_prng_impl == "threefry2x32"


@partial(jax.jit, static_argnums=(1, 2, 3))
def _normal_rows_program(key, rows, d, dtype):
    return jax.random.normal(key, (rows, d), dtype=dtype)


def normal_rows(key, n: int, d: int, dtype=jnp.float32):
    """``jax.random.normal(key, (n, d), dtype)``, the same numbers bit for bit, compiled per bucket.

    The program is compiled once per power-of-two row count rather than once per n: a sweep over
    particle counts compiles a few generators, not one per count (each compilation takes far
    longer than its work). Under a transformation (a traced key), or with a random stream whose
    prefixes differ (:func:`_prefix_stable`), it is the direct call.

    Args:
      key: a JAX PRNG key.
      n: the number of rows.
      d: the number of columns.
      dtype: the floating dtype.

    Returns:
      (n, d) standard normal array.
    """
    if isinstance(key, jax.core.Tracer) or not _prefix_stable():
        return jax.random.normal(key, (n, d), dtype=dtype)
    rows = _bucket_rows(n)
    out = _normal_rows_program(key, rows, int(d), jnp.dtype(dtype))
    return out if rows == n else jax.lax.slice_in_dim(out, 0, n, axis=0)


def sample_sphere(key, n: int, d: int, dtype=jnp.float32):
    """N points uniform on S^{d-1}: normalised standard Gaussians.

    Jittable and vmappable over ``key`` (n, d and dtype are static).

    Args:
      key: a JAX PRNG key.
      n: the number of points, an integer >= 1.
      d: the ambient dimension, an integer >= 2.
      dtype: the floating dtype.

    Returns:
      (n, d) array of unit rows (a ValueError for n < 1 or d < 2, or non-integers).
    """
    _check_n_d(n, d)
    # normalised outside the generator's program: the same rounding as an eager x / |x|
    # (inside one program XLA may rewrite the division, 1 ulp apart)
    return normalize(normal_rows(key, n, d, dtype))


@partial(jax.jit, static_argnums=(1, 2, 4))
def _vmf_cosines(key, n, d, kappa, dtype):
    """Wood (1994): sample 1 − w, w = ⟨x, μ⟩, for vMF(μ, κ) on S^{d-1}."""
    dim = d - 1.0
    kappa = jnp.asarray(kappa, dtype)
    b = dim / (jnp.sqrt(4.0 * kappa**2 + dim**2) + 2.0 * kappa)
    x0 = (1.0 - b) / (1.0 + b)
    # Wood's test κw + dim·log(1 − x0 w) − c ≥ log u, c = κ x0 + dim·log(1 − x0²), written with
    # the small quantities 1 − x0 = 2b/(1 + b) and 1 − w = 2bz/(1 − (1 − b)z) formed directly:
    # at large κ, x0 and w round to 1 in float32 (log(1 − x0²) = −inf: nothing was ever
    # accepted, the loop never ended) or lose the digits the test compares
    omx0 = 2.0 * b / (1.0 + b)
    log_c = jnp.log(omx0 * (1.0 + x0))  # log(1 − x0²)

    def cond(state):
        _, _, done = state
        return ~jnp.all(done)

    def body(state):
        key, w, done = state
        key, kz, ku = jax.random.split(key, 3)
        z = jax.random.beta(kz, dim / 2.0, dim / 2.0, (n,), dtype=dtype)
        u = jax.random.uniform(ku, (n,), dtype=dtype, minval=1e-12, maxval=1.0)
        omw = 2.0 * b * z / (1.0 - (1.0 - b) * z)  # 1 − w
        test = kappa * (omx0 - omw) + dim * (jnp.log(omx0 + x0 * omw) - log_c)
        # one decision for both uses below (materialised once): computed in two fusions, the
        # comparison could round differently (a sample marked done without its w: w = 0, on
        # the equator)
        acc = jax.lax.optimization_barrier(test >= jnp.log(u))
        return key, jnp.where(acc & ~done, omw, w), done | acc

    # carried and returned: 1 − w (w itself rounds to 1 at large κ in float32, where 1 − w,
    # of order 1/κ, is what places the sample)
    state = (key, jnp.zeros((n,), dtype), jnp.zeros((n,), bool))
    _, w, _ = jax.lax.while_loop(cond, body, state)
    return w


def _is_traced(a) -> bool:
    return isinstance(a, jax.core.Tracer)


def _kappa_checked(kappa):
    """κ checked on the host when concrete, guarded when traced.

    A traced κ outside (0, ∞) is replaced by 1 (so that the rejection loop ends) and reported as
    the mask of the samples to set to NaN.

    Returns:
      ``(kappa, bad)``: bad is None for a concrete κ.

    Raises:
      ValueError: for a concrete κ that is not a finite number > 0.
    """
    if not _is_traced(kappa):
        k = np.asarray(kappa)
        if k.ndim != 0 or not (np.isfinite(k) and k > 0):
            raise ValueError(f"kappa must be a finite number > 0, got {kappa!r}")
        return kappa, None
    bad = ~(jnp.isfinite(kappa) & (kappa > 0))
    return jnp.where(bad, jnp.ones_like(kappa), kappa), bad


def sample_vmf(key, n: int, mu, kappa: float, dtype=jnp.float32):
    """N points from the von Mises–Fisher law on S^{d-1}, density ∝ exp(κ ⟨μ, x⟩).

    Wood's (1994) rejection sampler for w = ⟨x, μ⟩, then a uniform tangent direction. Jittable
    and vmappable over ``key``, ``mu`` and ``kappa``; a traced κ that is not finite and > 0
    gives NaN samples (a concrete one raises).

    Args:
      key: a JAX PRNG key.
      n: the number of points, an integer >= 1.
      mu: mean direction, shape (d,) (normalised here; nonzero and finite).
      kappa: concentration κ > 0, finite.
      dtype: the floating dtype.

    Returns:
      (n, d) array of unit rows.

    Raises:
      ValueError: for a ``mu`` that is not a vector (or, when concrete, zero or non-finite), a
        concrete κ that is not finite and > 0, n < 1 or d < 2.
    """
    if not _is_traced(mu):
        m = np.asarray(mu)
        if m.ndim != 1:
            raise ValueError(f"mu must be a vector of shape (d,), got shape {m.shape}")
        norm = float(np.linalg.norm(m.astype(np.float64)))
        if not 0 < norm < math.inf:
            raise ValueError(f"mu must be a nonzero (finite) direction, got {m}")
    elif mu.ndim != 1:
        raise ValueError(f"mu must be a vector of shape (d,), got shape {mu.shape}")
    d = int(np.shape(mu)[0])
    _check_n_d(n, d)
    kappa, bad = _kappa_checked(kappa)
    mu = jnp.asarray(mu, dtype)
    mu = mu / jnp.linalg.norm(mu)
    kw, kv = jax.random.split(key)
    omw = _vmf_cosines(kw, n, d, kappa, dtype)  # 1 − ⟨x, μ⟩
    v = tangent_project(mu[None, :], normal_rows(kv, n, d, dtype))
    v = normalize(v)
    # the tangent length √(1 − w²) = √((1 − w)(1 + w)) from 1 − w (from w it was 0 once w
    # rounded to 1: every sample at μ from κ ~ 1e8 in float32)
    tang = jnp.sqrt(jnp.clip(omw * (2.0 - omw), 0.0))
    x = normalize((1.0 - omw)[:, None] * mu[None, :] + tang[:, None] * v)
    return x if bad is None else jnp.where(bad, jnp.nan, x)


def sample_mixture(key, n: int, d: int, *, mu=None, kappa: float = 4.0, weight: float = 0.5,
                   dtype=jnp.float32):
    """N points from ``(1 − weight)·uniform + weight·vMF(μ, κ)`` on S^{d-1}.

    Its density is strictly positive (≥ (1 − weight)/|S^{d-1}|) and Lipschitz, as Paper A's
    Assumption 3 requires, yet non-uniform. Jittable and vmappable over ``key``, ``mu``,
    ``kappa`` and ``weight``; a traced weight outside [0, 1) or κ outside (0, ∞) gives NaN
    samples (concrete ones raise).

    Args:
      key: a JAX PRNG key.
      n: the number of points, an integer >= 1.
      d: the ambient dimension, an integer >= 2.
      mu: the vMF mean direction, (d,); default (1, 1, …, 1)/√d.
      kappa: the vMF concentration κ > 0.
      weight: the vMF share, in [0, 1).
      dtype: the floating dtype.

    Returns:
      (n, d) array of unit rows.

    Raises:
      ValueError: for a concrete weight outside [0, 1) (and as :func:`sample_vmf` for mu and κ).
    """
    _check_n_d(n, d)
    bad = None
    if not _is_traced(weight):
        if not 0.0 <= float(weight) < 1.0:
            raise ValueError(f"weight must lie in [0, 1) for a strictly positive density, got "
                             f"{weight!r}")
    else:
        bad = ~((weight >= 0) & (weight < 1))
    if mu is None:
        mu = jnp.ones((d,), dtype) / math.sqrt(d)
    ku, kv, kc = jax.random.split(key, 3)
    xu = sample_sphere(ku, n, d, dtype)
    xv = sample_vmf(kv, n, mu, kappa, dtype)
    pick = jax.random.uniform(kc, (n, 1)) < weight
    x = jnp.where(pick, xv, xu)
    if _is_traced(kappa):  # a traced κ out of its domain: every row NaN, not only vMF's
        kappa_bad = ~(jnp.isfinite(kappa) & (kappa > 0))
        bad = kappa_bad if bad is None else bad | kappa_bad
    return x if bad is None else jnp.where(bad, jnp.nan, x)


def sample_initial(key, n: int, d: int, dist: str = "uniform", dtype=jnp.float32, **kw):
    """N points of the initial law named ``dist`` (the experiments' ``init`` section).

    Args:
      key: a JAX PRNG key.
      n: the number of points.
      d: the ambient dimension.
      dist: ``"uniform"`` (:func:`sample_sphere`), ``"vmf"`` (:func:`sample_vmf`; kw: mu,
        default e_1, and kappa, default 4) or ``"mixture"`` (:func:`sample_mixture`; kw: mu,
        kappa, weight).
      dtype: the floating dtype.
      **kw: the law's options.

    Returns:
      (n, d) array of unit rows.

    Raises:
      ValueError: for an unknown ``dist`` (and as the samplers for their arguments).
    """
    if dist == "uniform":
        return sample_sphere(key, n, d, dtype)
    if dist == "vmf":
        mu = kw.get("mu")
        if mu is None:
            mu = jnp.zeros((d,)).at[0].set(1.0)
        return sample_vmf(key, n, mu, kw.get("kappa", 4.0), dtype)
    if dist == "mixture":
        return sample_mixture(key, n, d, dtype=dtype, **kw)
    raise ValueError(f"initial distribution must be 'uniform', 'vmf' or 'mixture', got {dist!r}")
