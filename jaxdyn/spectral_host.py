r"""The host half of :mod:`jaxdyn.spectral`, in float64 NumPy, importing no JAX.

Assumption 1, top eigenspaces, principal angles and the spectral weights.

These are set-up steps (config checks, building weights), not part of a jitted loop; the config
check of ``jaxdyn config`` runs them without loading JAX. :mod:`jaxdyn.spectral` re-exports
every public name here beside its JAX functions of the particle positions (Π, the Lyapunov
functional, the mass near a subspace) and :func:`jaxdyn.spectral.spectral_weights`, which casts
:func:`spectral_weights_host` to JAX arrays.
"""

from __future__ import annotations

import dataclasses
import math
import typing as _typing

import numpy as np

from ._errors import DtypeError, HostOnlyError, dtype_message, host_only_message

if _typing.TYPE_CHECKING:
    from typing import Optional, Sequence, Tuple

__all__ = [
    "DEFAULT_RTOL",
    "AssumptionReport",
    "check_assumptions",
    "Eigenspace",
    "top_eigenspace",
    "subspace_angle",
    "rotation_matrix",
    "random_orthogonal",
    "SpectralWeights",
    "spectral_weights_host",
]

#: the default relative tolerance of the assumption checks and of eigenvalue clustering
#: (eigenvalues within ``rtol · max|μ|`` of each other count as equal)
DEFAULT_RTOL = 1e-6


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _host(name: str, a, fn: str) -> np.ndarray:
    """``a`` as a real NumPy array (a traced or complex one refused by name; float64 follows)."""
    if "Tracer" in type(a).__name__:  # (under jit/vmap/grad: no NumPy array of it)
        raise HostOnlyError(host_only_message(fn, name) + " (the spectral checks and builders "
                            "are set-up steps on the host, in float64 NumPy)")
    arr = np.asarray(a)
    msg = dtype_message(name, arr.dtype, half=True, fn=fn)
    if msg:
        raise DtypeError(msg)
    return arr.astype(np.float32) if arr.dtype.kind == "V" else arr  # (bfloat16: via float32)


def _square64(name: str, a, d: Optional[int] = None, *, fn: str) -> np.ndarray:
    """``a`` as a finite real (d, d) float64 NumPy matrix, d >= 1 (a ValueError naming ``name``)."""
    arr = _host(name, a, fn)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or (d is not None and arr.shape[0] != d) \
            or arr.shape[0] < 1:
        want = f"({d}, {d})" if d is not None else "(d, d) with d >= 1"
        raise ValueError(f"{name} must be a square matrix of shape {want}, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries")
    return arr


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + a.T)


def _top_cluster(mu_desc: np.ndarray, rtol: float) -> int:
    """Number of eigenvalues (sorted descending) equal to the first within rtol·scale."""
    scale = max(float(np.max(np.abs(mu_desc))), np.finfo(np.float64).tiny)
    return int(np.sum(mu_desc[0] - mu_desc <= rtol * scale))


def _orthonormal_basis(vectors: np.ndarray, rtol: float) -> np.ndarray:
    """Orthonormal basis (d, k) of the column span, rank by SVD with relative tolerance."""
    u, s, _ = np.linalg.svd(vectors, full_matrices=False)
    if s.size == 0 or s[0] == 0:
        return u[:, :0]
    k = int(np.sum(s > max(rtol, 1e-12) * s[0]))
    return u[:, :k]


# --------------------------------------------------------------------------------------
# Assumption 1
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AssumptionReport:
    """Which parts of Assumption 1 (Paper A) hold for (Q, K, V).

    Attributes:
      d: dimension.
      cond_B: 2-norm condition number of B = QᵀK (``inf`` if B = 0 or exactly singular).
      invertible: ``σ_min(B) > rtol · σ_max(B)``.
      asymmetry: relative asymmetry ``‖M - Mᵀ‖_F / ‖M‖_F`` of M = V Bᵀ (0 when M = 0).
      asymmetry_norm: ``‖M - Mᵀ‖_F``.
      symmetric: ``asymmetry <= rtol``.
      eigenvalues: eigenvalues μ1 >= μ2 >= ... of the symmetric part (M + Mᵀ)/2, by value.
      dim_E: multiplicity of μ1, counting eigenvalues within ``rtol · max|μ|`` of μ1 as equal.
      gap: γ = μ1 - (largest eigenvalue outside the top cluster); 0.0 if there is none.
      has_gap: ``dim_E < d`` (some eigenvalue is separated from μ1).
      rtol: the tolerance used for all three parts.
      failures: one readable message per failing part (empty if Assumption 1 holds).
      failed_parts: the failing parts as keys: ``"invertible"``, ``"symmetric"``, ``"gap"``.
    """

    d: int
    cond_B: float
    invertible: bool
    asymmetry: float
    asymmetry_norm: float
    symmetric: bool
    eigenvalues: Tuple[float, ...]
    dim_E: int
    gap: float
    has_gap: bool
    rtol: float
    failures: Tuple[str, ...]
    failed_parts: Tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True iff every part of Assumption 1 holds."""
        return not self.failures

    def __str__(self) -> str:
        yes = lambda b: "yes" if b else "NO "  # noqa: E731
        mu = ", ".join(f"{m:.6g}" for m in self.eigenvalues)
        head = "holds" if self.ok else f"FAILS ({len(self.failures)} of 3 parts)"
        lines = [
            f"Assumption 1 (Paper A), d = {self.d}, rtol = {self.rtol:g}: {head}",
            f"  B = QᵀK invertible   : {yes(self.invertible)}  cond(B) = {self.cond_B:.4g}",
            f"  M = V Bᵀ symmetric   : {yes(self.symmetric)}  ‖M − Mᵀ‖_F = {self.asymmetry_norm:.4g}"
            f" (relative {self.asymmetry:.4g})",
            f"  spectral gap γ > 0   : {yes(self.has_gap)}  γ = μ1 − μ2 = {self.gap:.6g},"
            f" dim E = {self.dim_E}",
            f"  eigenvalues of (M + Mᵀ)/2, largest first: {mu}",
        ]
        for f in self.failures:
            lines.append(f"  - {f}")
        return "\n".join(lines)


def _report(q: np.ndarray, k: np.ndarray, v: np.ndarray, rtol: float) -> AssumptionReport:
    d = q.shape[0]
    b = q.T @ k
    m = v @ b.T
    sv = np.linalg.svd(b, compute_uv=False)
    smax, smin = float(sv[0]), float(sv[-1])
    cond = smax / smin if smin > 0 else math.inf
    invertible = bool(smax > 0 and smin > rtol * smax)
    norm_m = float(np.linalg.norm(m))
    asym_norm = float(np.linalg.norm(m - m.T))
    asym = asym_norm / norm_m if norm_m > 0 else 0.0
    symmetric = bool(asym <= rtol)
    mu = np.linalg.eigvalsh(_sym(m))[::-1]
    dim_e = _top_cluster(mu, rtol)
    has_gap = dim_e < d
    gap = float(mu[0] - mu[dim_e]) if has_gap else 0.0

    failures, parts = [], []
    if not invertible:
        parts.append("invertible")
        failures.append(
            f"B = QᵀK is singular: cond(B) = {cond:.3g} (σ_min/σ_max = {smin / smax if smax else 0:.3g}"
            f" <= rtol = {rtol:g})"
        )
    if not symmetric:
        parts.append("symmetric")
        failures.append(
            f"M = V Bᵀ is not symmetric: ‖M − Mᵀ‖_F = {asym_norm:.4g} (relative {asym:.4g} > rtol = {rtol:g})"
        )
    if not has_gap:
        parts.append("gap")
        failures.append(
            f"no spectral gap: all {d} eigenvalues of (M + Mᵀ)/2 equal μ1 = {mu[0]:.6g} within rtol = {rtol:g}"
        )
    return AssumptionReport(
        d=d, cond_B=float(cond), invertible=invertible, asymmetry=float(asym),
        asymmetry_norm=asym_norm, symmetric=symmetric,
        eigenvalues=tuple(float(x) for x in mu), dim_E=int(dim_e), gap=gap, has_gap=bool(has_gap),
        rtol=float(rtol), failures=tuple(failures), failed_parts=tuple(parts),
    )


def check_assumptions(Q, K, V, *, rtol: float = DEFAULT_RTOL) -> AssumptionReport:
    r"""Check Assumption 1 of Paper A for the weights (Q, K, V), part by part.

        B = QᵀK invertible;  M = V Bᵀ symmetric;  gap γ = μ1 - μ2 > 0,

    μ1 > μ2 the two largest distinct eigenvalues (by value) of the symmetric part of M.
    One tolerance ``rtol`` serves the three tests: B is singular when
    ``σ_min(B) <= rtol · σ_max(B)``; M is asymmetric when ``‖M - Mᵀ‖_F > rtol ‖M‖_F``;
    eigenvalues within ``rtol · max|μ|`` of μ1 count as equal to it (they span E).

    Runs on the host in float64 (host-only: concrete weights); it never raises for a failing
    assumption.

    Args:
      Q: (d, d) query weights.
      K: (d, d) key weights.
      V: (d, d) value weights.
      rtol: the tolerance of the three tests, > 0.

    Returns:
      An :class:`AssumptionReport` (``.ok``, ``.failures``, a readable ``str``).

    Raises:
      ValueError: if Q, K, V are not real square (d, d) matrices of one d, or not finite, or
        for rtol <= 0.
    """
    fn = "check_assumptions"
    q = _square64("Q", Q, fn=fn)
    d = q.shape[0]
    k = _square64("K", K, d, fn=fn)
    v = _square64("V", V, d, fn=fn)
    if not rtol > 0:
        raise ValueError(f"rtol must be positive, got {rtol}")
    return _report(q, k, v, float(rtol))


# --------------------------------------------------------------------------------------
# eigenspaces
# --------------------------------------------------------------------------------------


class Eigenspace(_typing.NamedTuple):
    """A dominant eigenspace (host-side, float64 numpy).

    Attributes:
      basis: (d, k) orthonormal columns spanning the space.
      projector: (d, d) orthogonal projector ``basis @ basis.T``.
      value: the dominant eigenvalue (real part for a general matrix).
      eigenvalues: all eigenvalues, sorted by (real part) value, largest first; complex
        for a general matrix.
    """

    basis: np.ndarray
    projector: np.ndarray
    value: float
    eigenvalues: np.ndarray

    @property
    def dim(self) -> int:
        """The dimension k of the space."""
        return int(self.basis.shape[1])


def top_eigenspace(M, *, symmetric: bool = True, rtol: float = DEFAULT_RTOL,
                   by: str = "real") -> Eigenspace:
    r"""Eigenspace of the largest eigenvalue (by value) of M.

    ``symmetric=True`` (for M = V Bᵀ): uses the symmetric part (M + Mᵀ)/2 and ``eigh``; the
    space is spanned by the eigenvectors whose eigenvalue lies within ``rtol · max|μ|`` of
    μ1 (a cluster of equal eigenvalues gives dim > 1).

    ``symmetric=False`` (for V, generally non-symmetric): eigenvalues λ from ``eig``; the
    dominant ones are those whose *real part* is within ``rtol · max|λ|`` of the largest real
    part (the eigenvalue that dominates ``e^{tV}``). The space is the real span of their
    eigenvectors: for a complex pair a ± ib it is the 2-dimensional real invariant plane
    spanned by Re v and Im v. For a defective eigenvalue only the eigenvectors (not the
    generalised ones) are spanned.

    ``by="magnitude"`` (only with ``symmetric=False``): the other reading of Paper A's
    Conjecture 1, the eigenvalues of largest modulus |λ| (within ``rtol · max|λ|``; they
    dominate the power iteration Vᵏx, not the flow e^{tV}x). The two readings differ when
    V has a dominant negative eigenvalue. ``value`` is then the modulus.

    Host-only (float64 NumPy).

    Dtypes: float32 or float64, float16 or bfloat16, integers (all computed in float64 on the
    host); complex is refused (a TypeError naming the parameter); a traced input is refused
    with a TypeError naming the function (host-only).

    Args:
      M: a real (d, d) matrix.
      symmetric: use the symmetric part and ``eigh`` (else ``eig`` of M itself).
      rtol: the relative tolerance of the top cluster, > 0.
      by: ``"real"`` (largest real part) or ``"magnitude"`` (largest modulus; ``symmetric=False``).

    Returns:
      :class:`Eigenspace` (basis, projector, value, eigenvalues), float64 numpy.

    Raises:
      ValueError: for a matrix that is not real, square and finite, rtol <= 0, an unknown
        ``by``, or ``by="magnitude"`` with ``symmetric=True``.
    """
    m = _square64("M", M, fn="top_eigenspace")
    if not rtol > 0:
        raise ValueError(f"rtol must be positive, got {rtol}")
    if by not in ("real", "magnitude"):
        raise ValueError(f"by must be 'real' or 'magnitude', got {by!r}")
    if by == "magnitude" and symmetric:
        raise ValueError("by='magnitude' needs symmetric=False (the ordering of a general V)")
    if symmetric:
        w, u = np.linalg.eigh(_sym(m))
        w, u = w[::-1], u[:, ::-1]
        k = _top_cluster(w, rtol)
        basis = u[:, :k]
        return Eigenspace(basis, basis @ basis.T, float(w[0]), w)
    w, u = np.linalg.eig(m)
    order = np.argsort(-w.real, kind="stable")
    w, u = w[order], u[:, order]
    scale = max(float(np.max(np.abs(w))), np.finfo(np.float64).tiny)
    if by == "magnitude":
        top = (scale - np.abs(w)) <= rtol * scale
        value = scale
    else:
        top = (w.real[0] - w.real) <= rtol * scale
        value = float(w.real[0])
    vecs = u[:, top]
    basis = _orthonormal_basis(np.concatenate([vecs.real, vecs.imag], axis=1), 1e-9)
    return Eigenspace(basis, basis @ basis.T, value, w)


def subspace_angle(A, B) -> float:
    r"""Largest principal angle (radians) between span(A) and span(B), columns as vectors.

    If the dimensions differ, the angle of the smaller space into the larger one (0 when
    it is contained). A and B need not be orthonormal. Host-only (float64 NumPy).

    Dtypes: float32 or float64, float16 or bfloat16, integers (all computed in float64 on the
    host); complex is refused (a TypeError naming the parameter); a traced input is refused
    with a TypeError naming the function (host-only).

    Args:
      A: (d, k) columns (or a (d,) vector).
      B: (d, l) columns (or a (d,) vector).

    Returns:
      The angle in [0, π/2], a Python float.

    Raises:
      ValueError: for bases of different d or spanning only 0.
    """
    a = _host("A", A, "subspace_angle").astype(np.float64)
    b = _host("B", B, "subspace_angle").astype(np.float64)
    for name, arr in (("A", a), ("B", b)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} has non-finite entries")
    if a.ndim == 1:
        a = a[:, None]
    if b.ndim == 1:
        b = b[:, None]
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(f"A and B must be (d, k) bases of one d, got shapes {a.shape} and {b.shape}")
    qa = _orthonormal_basis(a, 1e-12)
    qb = _orthonormal_basis(b, 1e-12)
    k = min(qa.shape[1], qb.shape[1])
    if k == 0:
        raise ValueError("A and B must span non-zero subspaces")
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.arccos(np.clip(s[k - 1], -1.0, 1.0)))


def rotation_matrix(d: int, angle: float, plane: Sequence[int] = (0, 1), basis=None) -> np.ndarray:
    r"""Rotation by ``angle`` (radians) in the plane span(u, v), identity on its complement.

        R = I + (cos θ - 1)(u uᵀ + v vᵀ) + sin θ (v uᵀ - u vᵀ),   R u = cos θ u + sin θ v,

    with ``u, v = basis[:, i], basis[:, j]`` for ``plane = (i, j)``.

    Args:
      d: the dimension.
      angle: θ, radians.
      plane: (i, j), two distinct column indices of ``basis``.
      basis: (d, d) orthonormal columns (default I).

    Returns:
      A float64 NumPy (d, d) orthogonal matrix with det +1.

    Raises:
      ValueError: for a plane that is not two distinct indices in [0, d).
    """
    d = int(d)
    i, j = (int(p) for p in plane)
    if not (0 <= i < d and 0 <= j < d and i != j):
        raise ValueError(f"plane must be two distinct indices in [0, {d}), got {tuple(plane)}")
    bas = np.eye(d) if basis is None else _square64("basis", basis, d, fn="rotation_matrix")
    u, v = bas[:, i], bas[:, j]
    c, s = math.cos(angle), math.sin(angle)
    return np.eye(d) + (c - 1.0) * (np.outer(u, u) + np.outer(v, v)) + s * (np.outer(v, u) - np.outer(u, v))


def _eig_angle(m: np.ndarray, b: np.ndarray, rtol: float) -> float:
    """The angle between E(M) and E(V), V = M B^{-T}."""
    e_m = top_eigenspace(m, symmetric=True, rtol=rtol)
    v = m @ np.linalg.inv(b).T
    e_v = top_eigenspace(v, symmetric=False, rtol=rtol)
    return subspace_angle(e_m.basis, e_v.basis)


def _bisect(f, lo: float, hi: float) -> float:
    """The root of f on [lo, hi] (f(lo) < 0 <= f(hi), f continuous) by bisection.

    To the spacing of floats (about 50 halvings). Not SciPy's ``brentq``: ``jaxdyn config``
    calls this for configs with an ``eigenspace_angle``, and importing ``scipy.optimize`` takes
    longer than the whole check (``tests/test_startup.py`` keeps SciPy out of it).

    Returns:
      The right end of the final bracket.
    """
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return float(hi)


def random_orthogonal(d: int, seed=None, gaussian=None) -> np.ndarray:
    """A Haar-random orthogonal (d, d) matrix: the QR factor of a Gaussian matrix.

    Args:
      d: the dimension.
      seed: the seed of ``numpy.random.default_rng`` (when ``gaussian`` is None).
      gaussian: a (d, d) standard Gaussian matrix to use instead of drawing one.

    Returns:
      Q with its column signs fixed by diag(R) (Haar measure), float64 NumPy.
    """
    g = np.random.default_rng(seed).standard_normal((d, d)) if gaussian is None else gaussian
    q, r = np.linalg.qr(np.asarray(g, np.float64))
    return q * np.sign(np.diag(r))[None, :]  # Haar measure


class SpectralWeights(_typing.NamedTuple):
    """Weights with a prescribed spectrum of M = V Bᵀ (:func:`jaxdyn.spectral.spectral_weights`).

    Its arrays are float64 NumPy from :func:`spectral_weights_host`, JAX arrays of the requested
    dtype from :func:`jaxdyn.spectral.spectral_weights`.

    Attributes:
      Q: the query weights, I.
      K: the key weights, B.
      V: the value weights, M B^{-T}.
      M: U diag(mu) Uᵀ = V Bᵀ (symmetric by construction).
      B: QᵀK = B.
      U: orthogonal eigenvectors of M (column i has eigenvalue mu[i]).
      mu: the requested eigenvalues, in the given order.
      angle: largest principal angle (radians) between E(VBᵀ) = E(M) and E(V) (the dominant
        eigenspace of V, by real part; see :func:`top_eigenspace`).
      rotation_angle: the rotation angle of B when built from ``rotation`` or
        ``eigenspace_angle``; ``None`` otherwise.
    """

    Q: object
    K: object
    V: object
    M: object
    B: object
    U: object
    mu: object
    angle: float
    rotation_angle: Optional[float]


def spectral_weights_host(mu, B=None, U=None, *, rotation: Optional[float] = None,
                          eigenspace_angle: Optional[float] = None,
                          plane: Optional[Sequence[int]] = None, seed: Optional[int] = None,
                          rtol: float = DEFAULT_RTOL) -> SpectralWeights:
    r"""Weights with a prescribed spectrum of M = V Bᵀ, in float64 NumPy.

        M = U diag(mu) Uᵀ,   Q = I,   K = B,   V = M B^{-T}.

    :func:`jaxdyn.spectral.spectral_weights` documents the construction; this is its host
    half, without ``key`` and ``dtype`` (a random U comes from ``seed`` only).

    Args:
      mu: (d,) eigenvalues of M, d >= 2.
      B: explicit (d, d) invertible B (exclusive with ``rotation``/``eigenspace_angle``).
      U: (d, d) orthogonal eigenvectors (default: Haar-random from ``seed``, else I).
      rotation: the rotation angle θ of B, radians.
      eigenspace_angle: the angle wanted between E(VBᵀ) and E(V), radians in (0, π/2).
      plane: (i, j) the eigenvector pair of the rotation (default: argmax mu, argmin mu).
      seed: a NumPy seed for a Haar-random U.
      rtol: tolerance for the eigenspaces.

    Returns:
      :class:`SpectralWeights` of float64 NumPy arrays.

    Raises:
      ValueError: for a bad mu, U, B or plane, more than one of B/rotation/eigenspace_angle,
        an angle out of range or not reached, or a singular B.
    """
    mu_np = _host("mu", mu, "spectral_weights").astype(np.float64)
    if mu_np.ndim != 1 or mu_np.size < 2:
        raise ValueError(f"mu must be a vector of d >= 2 eigenvalues, got shape {mu_np.shape}")
    if not np.all(np.isfinite(mu_np)):
        raise ValueError(f"mu (the eigenvalues of M) must be finite, got {mu_np.tolist()}")
    d = mu_np.size
    if plane is None:
        plane = (int(np.argmax(mu_np)), int(np.argmin(mu_np)))
        if plane[0] == plane[1]:
            plane = (0, 1)
    if sum(a is not None for a in (B, rotation, eigenspace_angle)) > 1:
        raise ValueError("give at most one of B, rotation and eigenspace_angle")
    if U is None:
        u = random_orthogonal(d, seed) if seed is not None else np.eye(d)
    else:
        u = _square64("U", U, d, fn="spectral_weights")
        if not np.allclose(u.T @ u, np.eye(d), atol=1e-6):
            raise ValueError("U must be orthogonal (UᵀU = I)")
    m = _sym(u @ np.diag(mu_np) @ u.T)

    rot = None
    if B is not None:
        b = _square64("B", B, d, fn="spectral_weights")
    elif rotation is not None:
        rot = float(rotation)
        b = rotation_matrix(d, rot, plane, basis=u)
    elif eigenspace_angle is not None:
        target = float(eigenspace_angle)
        if not 0.0 < target < math.pi / 2:
            raise ValueError(f"eigenspace_angle must lie in (0, π/2) radians, got {target}")
        f = lambda th: _eig_angle(m, rotation_matrix(d, th, plane, basis=u), rtol) - target  # noqa: E731
        grid = np.linspace(0.0, math.pi / 2, 181)
        vals = [f(t) for t in grid]
        bracket = None
        for t0, t1, f0, f1 in zip(grid[:-1], grid[1:], vals[:-1], vals[1:]):
            if f0 < 0 <= f1 and abs(f1 - f0) < 0.2:  # continuous crossing (no eigen-switch jump)
                bracket = (t0, t1)
                break
        if bracket is None:
            reach = max(v + target for v in vals)
            raise ValueError(
                f"eigenspace_angle={target:.4g} rad is not reached by rotating B in plane {tuple(plane)}"
                f" (largest angle seen {reach:.4g} rad); try another plane or spectrum"
            )
        rot = _bisect(f, *bracket)
        b = rotation_matrix(d, rot, plane, basis=u)
    else:
        b = np.eye(d)
    sv = np.linalg.svd(b, compute_uv=False)
    if not sv[-1] > rtol * sv[0]:
        raise ValueError(f"B must be invertible, got cond(B) = {sv[0] / sv[-1] if sv[-1] else math.inf:.3g}")
    v = m @ np.linalg.inv(b).T
    return SpectralWeights(Q=np.eye(d), K=b, V=v, M=m, B=b, U=u, mu=mu_np,
                               angle=float(_eig_angle(m, b, rtol)), rotation_angle=rot)
