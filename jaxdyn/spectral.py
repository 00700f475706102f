r"""Spectral tools for Paper A: Assumption 1, the projection Π, the Lyapunov functional.

Conventions (docs/math.md §A.1): ``B = QᵀK``, ``M = V Bᵀ``. Assumption 1 asks B invertible and M
symmetric with a gap ``γ = μ1 - μ2 > 0`` between its two largest *distinct* eigenvalues
(largest first by value, not magnitude). E is the eigenspace of μ1 (it may have dimension
> 1), ``P_E`` its orthogonal projector, and

    Π(x) = P_E x / |P_E x|          (undefined on E⊥)

is the limit of the zero-temperature flow started at x. ``L(x) = |P_{E⊥} x|^2 / |P_E x|^2``
decays along that flow at rate at least ``2γ / ‖B‖``.

The checks and eigen-decompositions run on the host in float64 (numpy, in
:mod:`jaxdyn.spectral_host`, which imports no JAX; re-exported here): they are set-up
steps, not part of a jitted loop, and need concrete weights (host-only). :class:`Projection`,
:func:`lyapunov`, :func:`mass_near` and :func:`angle_to_subspace` are JAX functions of the
particle positions: they jit, vmap and (but for the count ``mass_near``) differentiate.
"""

from __future__ import annotations

import typing as _typing

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_bounds as _check_bounds, check_host as _check_host, real_arrays as _real_arrays
from .spectral_host import (  # the host (NumPy) half, re-exported
    DEFAULT_RTOL as DEFAULT_RTOL,
    AssumptionReport as AssumptionReport,
    Eigenspace as Eigenspace,
    SpectralWeights as SpectralWeights,
    _square64,
    check_assumptions as check_assumptions,
    random_orthogonal as _random_orthogonal,
    rotation_matrix as rotation_matrix,
    spectral_weights_host as _spectral_weights_host,
    subspace_angle as subspace_angle,
    top_eigenspace as top_eigenspace,
)

if _typing.TYPE_CHECKING:
    from typing import Optional, Sequence

    from jaxtyping import Array, Float

__all__ = [
    "DEFAULT_RTOL",
    "AssumptionReport",
    "check_assumptions",
    "Projection",
    "projection",
    "lyapunov",
    "Eigenspace",
    "top_eigenspace",
    "subspace_angle",
    "angle_to_subspace",
    "mass_near",
    "rotation_matrix",
    "SpectralWeights",
    "spectral_weights",
]

_HIGHEST = jax.lax.Precision.HIGHEST


def _float_dtype(*arrays, default=None) -> np.dtype:
    """The canonical floating dtype the arrays promote to (``default``, else JAX's default float)."""
    dts = [jax.dtypes.canonicalize_dtype(a.dtype) for a in arrays
           if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)]
    if dts:
        return np.dtype(jnp.result_type(*dts))
    return np.dtype(jax.dtypes.canonicalize_dtype(default if default is not None else float))


def _host_array(a, dtype):
    """A float64 NumPy result placed on the device in ``dtype`` (cast on the host, one transfer).

    No program of its own; inside a trace it becomes a constant of the program.

    Returns:
      The JAX array.
    """
    return jax.device_put(np.asarray(a, dtype))


# --------------------------------------------------------------------------------------
# Π and the Lyapunov functional
# --------------------------------------------------------------------------------------


class Projection(eqx.Module):
    r"""The map Π(x) = P_E x / |P_E x| onto the unit sphere of E (docs/math.md §A.4).

    Call it on points of shape (..., d). Undefined on E⊥: there ``P_E x = 0`` and the result
    is NaN (0/0), which is honest; such starts have measure zero under Assumption 2.
    Jittable, vmappable and differentiable in x (the projector is an array leaf).

    Attributes:
      projector: (d, d) orthogonal projector P_E.
      basis: (d, k) orthonormal basis of E.
      report: the :class:`AssumptionReport` it was built from (static).
    """

    projector: jax.Array
    basis: jax.Array
    report: AssumptionReport = eqx.field(static=True)

    @property
    def dim(self) -> int:
        """The dimension d of the ambient space."""
        return int(self.basis.shape[0])

    @property
    def dim_E(self) -> int:
        """The dimension k of E."""
        return int(self.basis.shape[1])

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        """Π(x) = P_E x / |P_E x| for points x of shape (..., d) (NaN on E⊥)."""
        px = jnp.matmul(x, self.projector, precision=_HIGHEST)  # P symmetric
        return px / jnp.linalg.norm(px, axis=-1, keepdims=True)


def projection(Q, K, V, *, force: bool = False, rtol: float = DEFAULT_RTOL) -> Projection:
    r"""Build Π(x) = P_E x / |P_E x| for the weights (Q, K, V) (docs/math.md §A.4).

    E is the top eigenspace (largest eigenvalue by value, clusters within ``rtol`` merged)
    of M = V Bᵀ, B = QᵀK. Assumption 1 is checked first (:func:`check_assumptions`); if a
    part fails, raises unless ``force=True``, in which case E is the top eigenspace of the
    symmetric part (M + Mᵀ)/2 (with no gap at all, E is the whole space and Π(x) = x/|x|).

    Host-only: the eigen-decomposition runs in float64 NumPy, so Q, K, V must be concrete
    (NumPy or JAX arrays; it may be called inside ``jax.jit`` on concrete weights, the projector
    then being a constant of the program). The returned :class:`Projection` is jittable.

    Args:
      Q: (d, d) query weights.
      K: (d, d) key weights.
      V: (d, d) value weights.
      force: build Π even if Assumption 1 fails (from the symmetric part of M).
      rtol: the tolerance of :func:`check_assumptions` and of the eigenvalue clusters.

    Dtypes: float32 or float64, float16 or bfloat16 (the host computes in float64); integers
    are converted to float; complex is refused (a TypeError naming the parameter). Traced
    weights are refused with a TypeError naming ``projection`` (host-only).

    Returns:
      The :class:`Projection`, its arrays in the floating dtype of the inputs.

    Raises:
      ValueError: naming each failing part of Assumption 1 (unless ``force``).
    """
    _check_host("projection", Q=Q, K=K, V=V)
    report = check_assumptions(Q, K, V, rtol=rtol)
    if not report.ok and not force:
        raise ValueError(
            "projection: Assumption 1 fails -- " + "; ".join(report.failures)
            + ". Pass force=True to use the top eigenspace of the symmetric part of M = V Bᵀ."
        )
    q, k, v = (_square64(n, a, fn="projection") for n, a in (("Q", Q), ("K", K), ("V", V)))
    es = top_eigenspace(v @ (q.T @ k).T, symmetric=True, rtol=rtol)
    dtype = _float_dtype(Q, K, V)
    return Projection(projector=_host_array(es.projector, dtype),
                      basis=_host_array(es.basis, dtype), report=report)


def _projector_of(P):
    """The (d, d) projector of a :class:`Projection` or an array (a ValueError otherwise)."""
    if isinstance(P, Projection):
        return P.projector
    P = jnp.asarray(P)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P_E must be a (d, d) projector or a Projection, got shape {P.shape}")
    return P


def lyapunov(x: Float[Array, "... d"], P_E) -> Float[Array, "..."]:
    r"""Lyapunov functional ``L(x) = |P_{E⊥} x|^2 / |P_E x|^2`` (tan² of the angle to E).

    Along the zero-temperature flow ``dL/dt <= -(2γ/‖B‖) L`` (docs/math.md §A.6). Infinite on
    E⊥. Jittable, vmappable and differentiable in x.

    Args:
      x: (..., d) points.
      P_E: the (d, d) orthogonal projector onto E, or a :class:`Projection`.

    Returns:
      (...) values of L.

    Raises:
      ValueError: ``P_E`` that is not a (d, d) projector, or points whose last axis is not d.
    """
    P = _projector_of(P_E)
    x = jnp.asarray(x)
    if x.ndim < 1 or x.shape[-1] != P.shape[-1]:
        raise ValueError(f"P_E is a ({P.shape[0]}, {P.shape[1]}) projector but the points x have "
                         f"shape {x.shape}: their last axis must have {P.shape[-1]} entries")
    px = jnp.matmul(x, P.T, precision=_HIGHEST)
    num = jnp.sum((x - px) ** 2, axis=-1)
    den = jnp.sum(px**2, axis=-1)
    return num / den


def _basis_of(basis):
    """(d, k) orthonormal columns of a :class:`Projection`, :class:`Eigenspace` or array."""
    if isinstance(basis, Projection):
        return basis.basis
    if isinstance(basis, Eigenspace):
        return jnp.asarray(basis.basis)
    b = jnp.asarray(basis)
    if b.ndim == 1:
        b = b[:, None]
    if b.ndim != 2:
        raise ValueError(f"basis must be (d, k) orthonormal columns, got shape {b.shape}")
    return b


def angle_to_subspace(x: Float[Array, "... d"], basis) -> Float[Array, "..."]:
    r"""Angle (radians, in [0, π/2]) between each point and the subspace span(basis).

        θ(x) = arctan2(|x - P x|, |P x|),   P = basis basisᵀ

    Jittable, vmappable and differentiable in x (away from θ = 0).

    Args:
      x: (..., d) points.
      basis: (d, k) orthonormal columns (or an :class:`Eigenspace` / :class:`Projection`).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to float; complex
    is refused (a TypeError naming ``x`` or ``basis``).

    Returns:
      (...) angles.
    """
    b = _basis_of(basis)
    x, b = _real_arrays(half=True, x=x, basis=b)
    x = jnp.asarray(x)
    c = jnp.matmul(x, b.astype(x.dtype), precision=_HIGHEST)  # coordinates in E
    px = jnp.matmul(c, b.T.astype(x.dtype), precision=_HIGHEST)
    return jnp.arctan2(jnp.linalg.norm(x - px, axis=-1), jnp.linalg.norm(c, axis=-1))


def mass_near(x: Float[Array, "... n d"], basis, angle: float) -> Float[Array, "..."]:
    r"""Fraction of the points of a cloud within ``angle`` (radians) of span(basis).

        mass = (1/N) #{ i : θ(x_i) <= angle },   θ as in :func:`angle_to_subspace`.

    Use it to track the mass near E(VBᵀ) and near E(V) over time (Conjecture 1). Jittable and
    vmappable (a count: its derivative in x is zero).

    Args:
      x: (..., N, d) clouds.
      basis: (d, k) orthonormal columns (or an :class:`Eigenspace` / :class:`Projection`).
      angle: the angle, radians, in [0, π/2] (a concrete angle outside, or NaN, is refused
        with a ValueError naming it).

    Returns:
      (...) fractions in [0, 1]; NaN where a traced ``angle`` is NaN or outside [0, π/2], or
      where a cloud holds a point that is not finite (it would count as far).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to float; complex
    is refused (a TypeError naming ``x`` or ``basis``).
    """
    _check_bounds("angle", angle, low=0.0, high=math.pi / 2, what=" (radians)")
    th = angle_to_subspace(x, basis)
    mass = jnp.mean((th <= angle).astype(th.dtype), axis=-1)
    ok = (angle >= 0) & (angle <= math.pi / 2)  # False for NaN
    ok = ok & jnp.all(jnp.isfinite(th), axis=-1)
    return jnp.where(ok, mass, jnp.nan)


# --------------------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------------------


def spectral_weights(
    mu,
    B=None,
    U=None,
    *,
    rotation: Optional[float] = None,
    eigenspace_angle: Optional[float] = None,
    plane: Optional[Sequence[int]] = None,
    key=None,
    seed: Optional[int] = None,
    dtype=jnp.float32,
    rtol: float = DEFAULT_RTOL,
) -> SpectralWeights:
    r"""Weights with a prescribed spectrum of M = V Bᵀ (docs/math.md §A.9, "Choosing examples").

        M = U diag(mu) Uᵀ,   Q = I,   K = B,   V = M B^{-T}    (so V Bᵀ = M exactly).

    Assumption 1 then holds whenever B is invertible and mu has a gap. To make E(VBᵀ) and
    E(V) differ (Conjecture 1), choose B ≠ I; a rotation keeps B perfectly conditioned:

    - ``rotation=θ``: B rotates by θ (radians) in the plane of eigenvectors
      ``U[:, i], U[:, j]``, ``(i, j) = plane`` (see :func:`rotation_matrix`);
    - ``eigenspace_angle=φ``: the same, with θ in (0, π/2] solved (by bisection) so that the
      angle between E(VBᵀ) and E(V) equals φ; raises ValueError if φ is not reached.

    The plane matters: on it V acts as the 2x2 block ``diag(μ_i, μ_j) R(θ)``, whose
    eigenvalues turn complex once ``(μ_i - μ_j)^2 cos^2 θ < 4 μ_i μ_j sin^2 θ``; then the
    dominant eigenspace of V is that whole plane, which contains E(VBᵀ), and the angle is
    0. So the default plane pairs the largest and the smallest eigenvalue (real eigenvalues
    for all θ when the smallest is negative). With mu = (1, 0.4, -0.2): ``rotation=0.6`` in
    plane (0, 1) gives angle 0; ``eigenspace_angle`` = 8° needs θ ≈ 0.198 in plane (0, 1)
    and θ ≈ 0.752 in the default plane (0, 2).

    Host-only (a set-up step, built in float64 NumPy; concrete arguments): the result's arrays
    are JAX arrays of ``dtype``.

    Args:
      mu: (d,) eigenvalues of M (any order; column i of U belongs to mu[i]).
      B: explicit (d, d) invertible B (exclusive with ``rotation``/``eigenspace_angle``).
      U: (d, d) orthogonal eigenvectors; default a Haar-random one from ``key`` or ``seed`` if
        given, else the identity.
      rotation: the rotation angle θ of B, radians.
      eigenspace_angle: the angle φ wanted between E(VBᵀ) and E(V), radians in (0, π/2).
      plane: (i, j) indices into mu / columns of U; default (argmax mu, argmin mu).
      key: a JAX PRNG key for a Haar-random U (concrete).
      seed: a NumPy seed for a Haar-random U (when no key is given).
      dtype: dtype of the returned arrays (built in float64, then cast).
      rtol: tolerance for the eigenspaces (clusters of equal eigenvalues).

    Returns:
      :class:`SpectralWeights` with ``angle`` = angle between E(VBᵀ) and E(V).
    """
    if U is None and key is not None:
        mu_np = np.asarray(mu, dtype=np.float64)
        if mu_np.ndim == 1 and mu_np.size >= 2:
            d = mu_np.size
            U = _random_orthogonal(d, gaussian=np.asarray(
                jax.random.normal(key, (d, d), dtype=jnp.float32), dtype=np.float64))
    sw = _spectral_weights_host(mu, B, U, rotation=rotation, eigenspace_angle=eigenspace_angle,
                               plane=plane, seed=seed, rtol=rtol)
    dt = _float_dtype(default=dtype)
    return sw._replace(**{f: _host_array(getattr(sw, f), dt) for f in ("Q", "K", "V", "M", "B", "U", "mu")})
